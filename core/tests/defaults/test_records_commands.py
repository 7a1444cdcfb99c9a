"""Tests of servehall.defaults.records_commands (``servehall db …`` and ``audit …``)
in-process with Typer's runner on a real SQLite database: upgrade then status, audit
verify on an intact and on a tampered chain, signed checkpoints, key generation, query
output formats. (The one-line errors for missing/unmigrated/unreachable databases are
``cli/test_operator.py``.)"""

from __future__ import annotations

import csv
import io
import json
import sqlite3
from datetime import UTC, datetime
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from servehall.defaults.records_commands import (
    FLOAT_DECIMALS,
    _render,
    _tidy,
    servehall_register_commands,
)


@pytest.fixture
def app() -> typer.Typer:
    cli = typer.Typer()
    servehall_register_commands(cli)
    return cli


def _run(app: typer.Typer, *args: str) -> tuple[int, str, str]:
    res = CliRunner().invoke(app, list(args))
    return res.exit_code, res.stdout, res.stderr


def _config(here: Path, extra: str = "") -> Path:
    cfg = here / "deploy.toml"
    cfg.write_text(f'sinks = []\n[database]\nurl = "sqlite+aiosqlite:///{here / "r.db"}"\n{extra}')
    return cfg


def test_keygen_writes_a_private_pair_and_never_overwrites(app: typer.Typer, here: Path) -> None:
    code, out, _ = _run(app, "audit", "keygen", str(here / "audit.key"))
    assert code == 0
    assert (here / "audit.key").stat().st_mode & 0o777 == 0o600
    pub = (here / "audit.key.pub").read_text()
    assert "BEGIN PUBLIC KEY" in pub and pub.strip() in out
    assert b"PRIVATE KEY" in (here / "audit.key").read_bytes()
    code, _, err = _run(
        app, "audit", "keygen", str(here / "other.key"), "--public-key", str(here / "audit.key.pub")
    )
    assert code == 2 and "exists; not overwritten" in err
    assert not (here / "other.key").exists()


def test_upgrade_status_verify_on_a_fresh_database(app: typer.Typer, here: Path) -> None:
    cfg = _config(here)
    code, out, _ = _run(app, "db", "upgrade", "--config", str(cfg))
    assert code == 0 and "migrated from an empty database to " in out
    assert "the schema is up to date" in out
    code, out, _ = _run(app, "db", "upgrade", "--config", str(cfg))
    assert code == 0 and "migrated from an empty database" not in out
    code, out, _ = _run(app, "db", "status", "--config", str(cfg))
    assert code == 0 and "— applied (core)" in out and out.endswith("schema is up to date\n")
    assert "quarantined records in record_rejected: none" in out
    code, out, _ = _run(app, "audit", "verify", "--config", str(cfg))
    assert code == 0
    assert out.startswith("OK: 0 audit event(s), chain intact (signed checkpoints not checked")


def _append_events(db: Path, n: int) -> None:
    """Append ``n`` correctly chained audit events (through the records chain code)."""
    import asyncio

    from servehall.db.engine import create_db_engine
    from servehall.records.chain import append_events
    from servehall.records.types import AuditEvent

    now = datetime.now(UTC)

    async def go() -> None:
        engine = create_db_engine(f"sqlite+aiosqlite:///{db}")
        try:
            async with engine.begin() as conn:
                events = [
                    AuditEvent(action="test", actor="admin", target=f"t{i}", at=now)
                    for i in range(n)
                ]
                await append_events(conn, events)
        finally:
            await engine.dispose()

    asyncio.run(go())


def test_verify_names_the_first_tampered_row(app: typer.Typer, here: Path) -> None:
    cfg = _config(here)
    assert _run(app, "db", "upgrade", "--config", str(cfg))[0] == 0
    _append_events(here / "r.db", 3)
    code, out, _ = _run(app, "audit", "verify", "--config", str(cfg))
    assert code == 0 and out.startswith("OK: 3 audit event(s), chain intact")
    with sqlite3.connect(here / "r.db") as conn:
        conn.execute("UPDATE audit_event SET target = 'forged' WHERE id = 2")
    code, out, _ = _run(app, "audit", "verify", "--config", str(cfg))
    assert code == 1 and out.startswith("FAILED: audit_event id 2: ")


def test_tidy_rounds_floats_only() -> None:
    assert _tidy(0.1 + 0.2) == 0.3 and _tidy(1 / 3) == round(1 / 3, FLOAT_DECIMALS)
    assert _tidy(3) == 3 and _tidy("0.30000000000000004") == "0.30000000000000004"
    assert _tidy(None) is None


ROWS = [
    {"tenant": "a", "latency": 0.1 + 0.2, "tags": ["x", "y"], "n": None},
    {"tenant": "b", "latency": 1.0, "tags": {"k": 1}, "n": 4},
]
COLS = ["tenant", "latency", "tags", "n"]


def test_render_json() -> None:
    assert json.loads(_render(COLS, ROWS, "json"))[0] == {
        "tenant": "a",
        "latency": 0.3,
        "tags": ["x", "y"],
        "n": None,
    }


def test_render_csv() -> None:
    rows = list(csv.DictReader(io.StringIO(_render(COLS, ROWS, "csv"))))
    assert rows[0] == {"tenant": "a", "latency": "0.3", "tags": '["x", "y"]', "n": ""}
    assert rows[1]["tags"] == '{"k": 1}'


def test_render_table() -> None:
    out = _render(COLS, ROWS, "table")
    assert "tenant" in out and "0.3 " in out and "0.30000000000000004" not in out
    lines = [line for line in out.splitlines() if "│ a" in line or "┃ a" in line]
    assert lines and "None" not in lines[0]


def test_query_refuses_an_unknown_view_or_time(app: typer.Typer, here: Path) -> None:
    cfg = _config(here)
    code, _, err = _run(app, "audit", "query", "nope", "--config", str(cfg))
    assert code == 2 and err.startswith("error: ")
    code, _, err = _run(
        app, "audit", "query", "audit_events", "--since", "yesterday-ish", "--config", str(cfg)
    )
    assert code == 2 and err.startswith("error: ")


def test_query_formats_on_a_real_database(app: typer.Typer, here: Path) -> None:
    cfg = _config(here)
    assert _run(app, "db", "upgrade", "--config", str(cfg))[0] == 0
    code, out, _ = _run(
        app, "audit", "query", "audit_events", "--format", "json", "--config", str(cfg)
    )
    assert code == 0 and json.loads(out) == []
    code, out, _ = _run(
        app, "audit", "query", "audit_events", "--format", "csv", "--config", str(cfg)
    )
    assert code == 0 and out.count("\n") == 1  # the header only
