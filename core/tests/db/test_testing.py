"""Tests of servehall.db.testing, the database helpers of the test suites: the URL and
reachability checks, require_pg's skip/fail, run_sql/wait_rows, the reject_rows trigger
on real SQLite and PostgreSQL, and the private-database round trip on the test server."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from sqlalchemy.exc import IntegrityError

from servehall.db.testing import (
    PG_DEFAULT_URL,
    REJECT_MESSAGE,
    _plain_dsn,
    accept_rows,
    create_pg_database,
    drop_pg_database,
    pg_port_open,
    pg_reachable,
    pg_test_url,
    reject_rows,
    require_pg,
    run_sql,
    wait_rows,
)
from servehall.testing.sockets import free_port


def test_pg_test_url_and_plain_dsn(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SERVEHALL_TEST_PG_URL", raising=False)
    assert pg_test_url() == PG_DEFAULT_URL
    monkeypatch.setenv("SERVEHALL_TEST_PG_URL", "postgresql+asyncpg://u:p@h:1/d")
    assert pg_test_url() == "postgresql+asyncpg://u:p@h:1/d"
    assert _plain_dsn("postgresql+asyncpg://u:p@h:1/d") == "postgresql://u:p@h:1/d"
    assert _plain_dsn("postgresql+asyncpg://u:p@h:1/d", "other") == "postgresql://u:p@h:1/other"


def test_port_open_and_require_pg_on_a_closed_port(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        assert pg_port_open(f"postgresql+asyncpg://u@127.0.0.1:{listener.getsockname()[1]}/d")
    closed = f"postgresql+asyncpg://u:secret@127.0.0.1:{free_port()}/d"
    assert not pg_port_open(closed)
    monkeypatch.setenv("SERVEHALL_TEST_PG_URL", closed)
    monkeypatch.setenv("CI", "false")
    with pytest.raises(pytest.skip.Exception) as skipped:
        require_pg()
    assert "not reachable" in str(skipped.value) and "secret" not in str(skipped.value)
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="CI=true"):
        require_pg()


async def test_pg_reachable_is_false_on_a_closed_port() -> None:
    assert not await pg_reachable(f"postgresql+asyncpg://u@127.0.0.1:{free_port()}/d", 1.0)


async def _request_log(url: str) -> None:
    await run_sql(url, "CREATE TABLE request_log (request_id VARCHAR(20) PRIMARY KEY)")


async def test_run_sql_rows_on_sqlite(tmp_path: Path) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'r.db'}"
    await _request_log(url)
    assert await run_sql(url, "INSERT INTO request_log VALUES ('a'), ('b')") == []
    rows = await run_sql(url, "SELECT request_id FROM request_log ORDER BY request_id")
    assert [tuple(r) for r in rows] == [("a",), ("b",)]


def test_wait_rows_returns_what_there_is_after_the_timeout(tmp_path: Path) -> None:
    import asyncio
    import time

    url = f"sqlite+aiosqlite:///{tmp_path / 'w.db'}"
    asyncio.run(_request_log(url))
    asyncio.run(run_sql(url, "INSERT INTO request_log VALUES ('a')"))
    t0 = time.monotonic()
    assert len(wait_rows(url, "SELECT * FROM request_log", 1, timeout=5)) == 1
    assert time.monotonic() - t0 < 2  # returns once there are enough rows
    assert len(wait_rows(url, "SELECT * FROM request_log", 2, timeout=0.2, every=0.05)) == 1


async def test_reject_rows_refuses_matching_rows_until_accept_rows(
    db_url: str,
) -> None:
    await _request_log(db_url)
    await reject_rows(db_url, "NEW.request_id = 'bad'")
    await run_sql(db_url, "INSERT INTO request_log VALUES ('good')")
    with pytest.raises(Exception, match="rejected by reject_rows") as exc:
        await run_sql(db_url, "INSERT INTO request_log VALUES ('bad')")
    if db_url.startswith("sqlite"):
        assert isinstance(exc.value, IntegrityError)  # a row error, not a database error
    else:
        assert getattr(getattr(exc.value, "orig", None), "sqlstate", None) == "22023"
    assert REJECT_MESSAGE in str(exc.value)
    await accept_rows(db_url)
    await accept_rows(db_url)  # no trigger left: no error
    await run_sql(db_url, "INSERT INTO request_log VALUES ('bad')")
    rows = await run_sql(db_url, "SELECT request_id FROM request_log ORDER BY request_id")
    assert [r[0] for r in rows] == ["bad", "good"]


async def test_create_and_drop_a_private_database() -> None:
    url = await create_pg_database(require_pg(), prefix="servehall_tt")
    try:
        assert url.rsplit("/", 1)[1].startswith("servehall_tt_")
        assert [tuple(r) for r in await run_sql(url, "SELECT 1")] == [(1,)]
    finally:
        await drop_pg_database(url)
    names = await run_sql(require_pg(), "SELECT datname FROM pg_database")
    assert url.rsplit("/", 1)[1] not in {r[0] for r in names}
