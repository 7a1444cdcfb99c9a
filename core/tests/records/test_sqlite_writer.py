"""The ``sql`` sink's SQLite fast path (:mod:`servehall.records.sqlite_writer`) on a real
SQLite file: which URLs take it, rows land as through SQLAlchemy, audit events keep the
chain, a failed batch is retried on a reopened connection, and a row SQLite rejects
fails its batch with an error the runner treats as a suspect row."""

from __future__ import annotations

import sqlite3
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from record_fixtures import request_record as _rec

from servehall import AuditEvent
from servehall.db import create_db_engine
from servehall.db.migrate import upgrade_database
from servehall.db.testing import reject_rows, run_sql
from servehall.records.chain import verify_chain
from servehall.records.sql_sink import SqlSink, suspect_row
from servehall.records.sqlite_writer import sqlite_file


@pytest.fixture
async def url(tmp_path: Path) -> str:
    url = f"sqlite+aiosqlite:///{tmp_path / 'records.db'}"
    engine = create_db_engine(url)
    await upgrade_database(engine)
    await engine.dispose()
    return url


def test_only_plain_sqlite_files_take_the_fast_path(tmp_path: Path) -> None:
    assert sqlite_file(f"sqlite+aiosqlite:///{tmp_path}/a.db") == f"{tmp_path}/a.db"
    assert sqlite_file("sqlite+aiosqlite:///servehall.db") == "servehall.db"
    for other in (
        "sqlite+aiosqlite://",
        "sqlite+aiosqlite:///:memory:",
        "sqlite+aiosqlite:///file:x.db?mode=ro&uri=true",
        f"sqlite+aiosqlite:///{tmp_path}/a.db?timeout=5",
        "postgresql+asyncpg://u:p@localhost/db",
        "not a url",
    ):
        assert sqlite_file(other) is None, other


def test_sqlite_content_errors_are_suspect_and_others_retry() -> None:
    assert suspect_row(sqlite3.IntegrityError("NOT NULL constraint failed"))
    assert suspect_row(sqlite3.DataError("string or blob too big"))
    # issue 33: a value the driver cannot bind is a row's fault, not an outage
    assert suspect_row(sqlite3.ProgrammingError("Error binding parameter 24"))
    assert not suspect_row(sqlite3.OperationalError("database is locked"))
    assert not suspect_row(sqlite3.OperationalError("no such table: request_log"))


async def test_rows_land_as_through_sqlalchemy_and_audit_keeps_its_chain(url: str) -> None:
    sink = SqlSink(url)
    await sink.start()
    try:
        assert sink._rows is not None  # the fast path is on for a SQLite file
        verdicts = [{"rule": "r", "action": "flag", "count": 1}]
        await sink.write(
            [_rec(0, filter_verdicts=verdicts), _rec(1, stream=True, prompt_text="a\x00b")]
        )
        await sink.write([_rec(1)])  # a retried batch never duplicates a row
        audit = AuditEvent(action="config_reload", actor="admin", details={"n": 1})
        await sink.write([_rec(2), audit])  # with an audit event: SQLAlchemy, one tx
    finally:
        await sink.close()
        await sink.close()  # idempotent
    rows = await run_sql(
        url,
        "SELECT request_id, stream, prompt_text, filter_verdicts, received_at "
        "FROM request_log ORDER BY request_id",
    )
    assert [r.request_id for r in rows] == ["req-0", "req-1", "req-2"]
    assert bool(rows[1].stream) is True and rows[1].prompt_text == "ab"
    assert str(rows[0].received_at) == "2026-11-29 12:00:00.000000"
    assert "flag" in str(rows[0].filter_verdicts)
    engine = create_db_engine(url)
    try:
        result = await verify_chain(engine)
    finally:
        await engine.dispose()
    assert result.ok and result.checked >= 1


async def test_a_failed_batch_raises_then_succeeds_on_a_reopened_connection(url: str) -> None:
    sink = SqlSink(url)
    await sink.start()
    path = sqlite_file(url)
    assert path is not None
    try:
        await sink.write([_rec(0)])
        other = sqlite3.connect(path, isolation_level=None)
        other.execute("ALTER TABLE request_log RENAME TO request_log_away")
        with pytest.raises(sqlite3.OperationalError, match="request_log"):
            await sink.write([_rec(1)])
        other.execute("ALTER TABLE request_log_away RENAME TO request_log")
        other.close()
        await sink.write([_rec(1)])  # what the runner's retry does
    finally:
        await sink.close()
    rows = await run_sql(url, "SELECT request_id FROM request_log ORDER BY request_id")
    assert [r.request_id for r in rows] == ["req-0", "req-1"]


async def test_a_row_sqlite_rejects_fails_the_batch_with_a_suspect_error(url: str) -> None:
    await reject_rows(url, "NEW.request_id = 'req-1'")
    sink = SqlSink(url)
    await sink.start()
    try:
        with pytest.raises(sqlite3.IntegrityError) as info:
            await sink.write([_rec(0), _rec(1), _rec(2)])
        assert suspect_row(info.value)  # the runner splits it (records/test_quarantine.py)
        await sink.write([_rec(0), _rec(2)])  # the kept connection still writes
    finally:
        await sink.close()
    rows = await run_sql(url, "SELECT request_id FROM request_log ORDER BY request_id")
    assert [r.request_id for r in rows] == ["req-0", "req-2"]
