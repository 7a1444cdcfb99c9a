"""Alembic migrations, run programmatically (``servehall db upgrade``, auto-migrate,
and the schema check ``serve`` does before it accepts requests).

The migration tree lives in the repository's ``migrations/`` directory (``alembic.ini``
beside it); ``$SERVEHALL_MIGRATIONS`` points elsewhere. The core's revisions form the
main line from ``0001_base``; plugin-owned tables are separate branches rooted at
``0001_base`` (``branch_labels = ("<plugin>",)``), so upgrading always targets ``heads``.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

# Alembic logs one INFO line per built-in plugin on import; not useful to operators.
logging.getLogger("alembic.runtime.plugins").setLevel(logging.WARNING)

from alembic import command  # noqa: E402
from alembic.config import Config  # noqa: E402
from alembic.runtime.migration import MigrationContext  # noqa: E402
from alembic.script import ScriptDirectory  # noqa: E402
from sqlalchemy.engine import Connection  # noqa: E402
from sqlalchemy.ext.asyncio import AsyncEngine  # noqa: E402

from servehall.errors import ConfigError  # noqa: E402

UPGRADE_HINT = "servehall db upgrade"


def migrations_dir() -> Path:
    """The Alembic script directory (``$SERVEHALL_MIGRATIONS`` or the repo's ``migrations``).

    Raises:
        ConfigError: no migration directory can be found.
    """
    env = os.environ.get("SERVEHALL_MIGRATIONS")
    candidates = [Path(env)] if env else []
    here = Path(__file__).resolve()
    candidates += [p / "migrations" for p in here.parents]
    for c in candidates:
        if (c / "env.py").is_file() and (c / "versions").is_dir():
            return c
    raise ConfigError("cannot find the servehall migrations directory; set SERVEHALL_MIGRATIONS")


def alembic_config() -> Config:
    """An Alembic :class:`Config` for the servehall migration tree."""
    mdir = migrations_dir()
    ini = mdir.parent / "alembic.ini"
    cfg = Config(str(ini)) if ini.is_file() else Config()
    cfg.set_main_option("script_location", str(mdir))
    cfg.set_main_option("version_locations", str(mdir / "versions"))
    cfg.set_main_option("path_separator", "os")
    return cfg


def script_heads() -> set[str]:
    """Every head revision of the migration tree (core and plugin branches)."""
    return set(ScriptDirectory.from_config(alembic_config()).get_heads())


def _current_heads(conn: Connection) -> set[str]:
    return set(MigrationContext.configure(conn).get_current_heads())


class SchemaTooNewError(ConfigError):
    """The database is at a revision this servehall does not know: another replica (or
    ``servehall db upgrade``) of a newer release migrated it. ``database_revisions``
    holds the unknown revision(s), ``known_heads`` this release's head(s)."""

    def __init__(self, database: set[str], code: set[str]) -> None:
        self.database_revisions = database
        self.known_heads = code
        super().__init__(
            "database schema is newer than this servehall: the database is at revision "
            + ", ".join(sorted(database))
            + ", this release knows up to "
            + ", ".join(sorted(code))
            + "; run the newer servehall release on this replica (a replica never "
            "downgrades a shared database)"
        )


def _missing_heads(conn: Connection) -> set[str]:
    """Heads of the tree that the database has not reached.

    Raises:
        SchemaTooNewError: the database has a revision the tree does not contain.
    """
    script = ScriptDirectory.from_config(alembic_config())
    current = _current_heads(conn)
    unknown = {rev for rev in current if rev not in _known_revisions(script)}
    if unknown:
        raise SchemaTooNewError(unknown, set(script.get_heads()))
    applied: set[str] = set()
    for rev in current:
        for r in script.iterate_revisions(rev, "base"):
            applied.add(r.revision)
    return {h for h in script.get_heads() if h not in applied}


def _known_revisions(script: ScriptDirectory) -> set[str]:
    return {r.revision for r in script.walk_revisions()}


#: ``pg_advisory_xact_lock`` key held while migrating, so replicas started together with
#: ``auto_migrate`` run the migrations one after the other (the second finds nothing to do).
MIGRATION_LOCK_KEY = 0x5E5E_0001


def _upgrade(conn: Connection, cfg: Config) -> None:
    if conn.dialect.name == "postgresql":
        conn.exec_driver_sql(f"SELECT pg_advisory_xact_lock({MIGRATION_LOCK_KEY})")
    _missing_heads(conn)  # refuses a database newer than this release (SchemaTooNewError)
    cfg.attributes["connection"] = conn
    command.upgrade(cfg, "heads")


async def upgrade_database(engine: AsyncEngine) -> None:
    """Run ``alembic upgrade heads`` on ``engine``'s database (in one transaction)."""
    cfg = alembic_config()
    async with engine.begin() as conn:
        await conn.run_sync(_upgrade, cfg)


@contextlib.contextmanager
def _quiet_alembic() -> Iterator[None]:
    """Silence Alembic's INFO chatter ("Context impl …") while only checking."""
    logger = logging.getLogger("alembic")
    old = logger.level
    logger.setLevel(logging.WARNING)
    try:
        yield
    finally:
        logger.setLevel(old)


async def pending_heads(engine: AsyncEngine) -> set[str]:
    """Heads of the migration tree the database lacks (empty: fully migrated)."""
    with _quiet_alembic():
        async with engine.connect() as conn:
            return await conn.run_sync(_missing_heads)


async def ensure_schema(engine: AsyncEngine, *, auto_migrate: bool, config_hint: str = "") -> None:
    """Make sure the schema is current: migrate when ``auto_migrate``, else refuse.

    Raises:
        ConfigError: the database is not migrated (the message names the command to run),
            or cannot be reached.
    """
    try:
        missing = await pending_heads(engine)
        if missing and auto_migrate:
            await upgrade_database(engine)
            missing = await pending_heads(engine)
    except ConfigError:
        raise
    except Exception as exc:
        raise ConfigError(f"database: cannot check the schema: {_brief(exc)}") from None
    if missing:
        raise ConfigError(
            "database is not migrated (missing revision(s): "
            + ", ".join(sorted(missing))
            + f"); run `{UPGRADE_HINT}{config_hint}` (with the same --config) first, or set "
            "[database] auto_migrate = true"
        )


def _brief(exc: BaseException) -> str:
    text: Any = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {text}"[:300]
