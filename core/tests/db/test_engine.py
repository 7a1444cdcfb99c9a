"""Tests of servehall.db.engine: URL checks and masking, PostgreSQL session bounds, and
real engines — a SQLite file with servehall's pragmas, PostgreSQL with the server-side
timeouts applied to each session (skips without the test PostgreSQL)."""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path

import pytest
from sqlalchemy import text

from servehall import ConfigError, Settings
from servehall.db.engine import (
    DbTimeouts,
    create_db_engine,
    database_url,
    safe_url,
    sqlite_pragmas,
)


def test_safe_url_masks_the_password() -> None:
    assert (
        safe_url("postgresql+asyncpg://app:s3cret@db:5432/servehall")
        == "postgresql+asyncpg://app:***@db:5432/servehall"
    )
    assert safe_url("sqlite+aiosqlite:///x.db") == "sqlite+aiosqlite:///x.db"
    assert safe_url("::not a url::") == "<unparseable database url>"


def test_database_url_reads_the_secret() -> None:
    settings = Settings(database={"url": "postgresql+asyncpg://u:pw@h/d"})
    assert database_url(settings) == "postgresql+asyncpg://u:pw@h/d"
    assert "pw" not in repr(settings.database.url)


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("::not a url::", "database.url: not a valid SQLAlchemy URL"),
        ("sqlite:///x.db", "driver 'sqlite' is not supported; use sqlite+aiosqlite://"),
        ("postgresql+psycopg://u@h/d", "driver 'postgresql+psycopg' is not supported"),
    ],
)
def test_bad_urls_are_config_errors(url: str, message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        create_db_engine(url)


def test_timeouts_connect_args() -> None:
    assert DbTimeouts().connect_args() == {
        "server_settings": {
            "statement_timeout": "30000",
            "lock_timeout": "10000",
            "idle_in_transaction_session_timeout": "30000",
        },
        "command_timeout": 30.0,
        "timeout": 30.0,
    }
    # 0 = no limit: the setting is left to the server, the client bound dropped
    assert DbTimeouts(0, 0.25, 0).connect_args() == {"server_settings": {"lock_timeout": "250"}}


def test_timeouts_of_settings() -> None:
    settings = Settings(
        database={"command_timeout_s": 5, "lock_timeout_s": 0, "idle_in_transaction_timeout_s": 7}
    )
    assert DbTimeouts.of(settings) == DbTimeouts(5, 0, 7)


def test_sqlite_pragmas_on_a_plain_connection(tmp_path: Path) -> None:
    conn = sqlite3.connect(tmp_path / "p.db")
    try:
        sqlite_pragmas(conn)
        assert conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)
        assert conn.execute("PRAGMA synchronous").fetchone() == (1,)  # NORMAL
        assert conn.execute("PRAGMA busy_timeout").fetchone() == (10000,)
        assert conn.execute("PRAGMA foreign_keys").fetchone() == (1,)
    finally:
        conn.close()


async def test_sqlite_engine_applies_the_pragmas(tmp_path: Path) -> None:
    engine = create_db_engine(f"sqlite+aiosqlite:///{tmp_path / 'records.db'}")
    try:
        async with engine.connect() as conn:
            mode = (await conn.execute(text("PRAGMA journal_mode"))).scalar()
            fks = (await conn.execute(text("PRAGMA foreign_keys"))).scalar()
            busy = (await conn.execute(text("PRAGMA busy_timeout"))).scalar()
        assert (mode, fks, busy) == ("wal", 1, 10000)
        assert (tmp_path / "records.db").exists()
    finally:
        await engine.dispose()


async def test_postgresql_sessions_carry_the_timeouts() -> None:
    from servehall.db.testing import require_pg

    url = require_pg()
    settings = Settings(
        database={
            "url": url,
            "command_timeout_s": 12,
            "lock_timeout_s": 3,
            "idle_in_transaction_timeout_s": 0,
        }
    )
    engine = create_db_engine(settings)
    try:
        assert engine.pool.size() == 4  # type: ignore[attr-defined]
        async with engine.connect() as conn:
            stmt = (await conn.execute(text("SHOW statement_timeout"))).scalar()
            lock = (await conn.execute(text("SHOW lock_timeout"))).scalar()
            idle = (await conn.execute(text("SHOW idle_in_transaction_session_timeout"))).scalar()
        assert (stmt, lock, idle) == ("12s", "3s", "0")
    finally:
        await engine.dispose()
    # a bare URL (migrations, tools) gets no bounds: the server defaults apply
    bare = create_db_engine(url)
    try:
        async with bare.connect() as conn:
            stmt = (await conn.execute(text("SHOW statement_timeout"))).scalar()
        assert stmt == "0"
    finally:
        await bare.dispose()
