"""Every migration creates exactly the tables its code defines (Alembic autogenerate finds
no difference), for the core, the auth plugin and the example plugin, on SQLite and
PostgreSQL; plugin branches are applied only when enabled and never dropped."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from servehall import MigrationBranch
from servehall.db.engine import create_db_engine
from servehall.db.migrate import branch_status, pending_heads, upgrade_database
from servehall.db.testing import run_sql
from servehall.errors import ConfigError, PluginError
from servehall.testing.migrations import schema_diff

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE_SRC = ROOT / "examples" / "webhook_sink" / "src"


def _auth() -> list[MigrationBranch]:
    from servehall_auth.plugin import servehall_migrations

    return servehall_migrations()


def _example() -> list[MigrationBranch]:
    if str(EXAMPLE_SRC) not in sys.path:
        sys.path.insert(0, str(EXAMPLE_SRC))
    from servehall_webhook_sink.plugin import servehall_migrations

    return servehall_migrations()


@pytest.mark.parametrize("which", ["core", "auth", "example", "all"])
async def test_migrations_match_table_definitions(db_url: str, which: str) -> None:
    branches = {
        "core": [],
        "auth": _auth(),
        "example": _example(),
        "all": [*_auth(), *_example()],
    }[which]
    diff = await schema_diff(db_url, branches)
    assert diff == [], diff


async def test_only_enabled_branches_apply_and_disabling_drops_nothing(tmp_path: Path) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'b.db'}"
    engine = create_db_engine(url)
    try:
        auth, example = _auth(), _example()
        await upgrade_database(engine, auth, known=example)
        tables = {r[0] for r in await run_sql(url, "SELECT name FROM sqlite_master")}
        assert "api_key" in tables and "webhook_delivery" not in tables
        # auth disabled now: it is only "known"; its table and version row stay
        await upgrade_database(engine, example, known=auth)
        tables = {r[0] for r in await run_sql(url, "SELECT name FROM sqlite_master")}
        assert {"api_key", "webhook_delivery", "request_log"} <= tables
        assert await pending_heads(engine, example, known=auth) == set()
        rows = {
            label: (applied, enabled)
            for label, _, applied, enabled in await branch_status(engine, example, known=auth)
        }
        assert rows == {
            "servehall": (True, True),
            "webhook_sink": (True, True),
            "auth": (True, False),
        }
        # a revision whose plugin is not installed at all: a clear refusal, not a crash
        assert await pending_heads(engine, example) == set()  # unknown branches are ignored
        with pytest.raises(ConfigError, match=r"at revision auth_\d{4}_\w+.*install the plugin"):
            await upgrade_database(engine, example)
    finally:
        await engine.dispose()


async def test_missing_branch_names_the_plugin(tmp_path: Path) -> None:
    engine = create_db_engine(f"sqlite+aiosqlite:///{tmp_path / 'c.db'}")
    try:
        with pytest.raises(PluginError) as err:
            await upgrade_database(engine, [MigrationBranch("ghost", tmp_path / "nowhere")])
        assert str(err.value).startswith("plugin 'ghost': migration branch 'ghost' is missing")
        other = tmp_path / "other"
        other.mkdir()
        (other / "x_0001.py").write_text(
            'revision = "x_0001"\ndown_revision = "0001_base"\nbranch_labels = ("x",)\n'
            "def upgrade():\n    pass\n"
        )
        with pytest.raises(PluginError, match="plugin 'ghost': migration branch 'ghost'"):
            await upgrade_database(engine, [MigrationBranch("ghost", other)])
    finally:
        await engine.dispose()
