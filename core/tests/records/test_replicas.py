"""Several replicas on one database, on a real SQLite file and a real PostgreSQL:
``request_log.replica`` (migration ``0003_replica``) and the per-replica view, the views
aggregating across replicas, a schema newer than this release refused with both
revisions named, and ``commit_wait_s`` (a response waits until its row is written)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from servehall import ConfigError, RequestRecord
from servehall.db import create_db_engine
from servehall.db.migrate import SchemaTooNewError, ensure_schema, script_heads, upgrade_database
from servehall.db.testing import run_sql
from servehall.records.queries import run_query
from servehall.records.runner import SinkRunner
from servehall.records.sql_sink import SqlSink


def _rec(i: int, replica: str | None, **kw: Any) -> RequestRecord:
    at = datetime(2026, 11, 30, 12, 0, tzinfo=UTC) + timedelta(seconds=i)
    fields: dict[str, Any] = {
        "request_id": f"r-{i}",
        "received_at": at,
        "finished_at": at,
        "tenant": "acme",
        "model": "demo",
        "endpoint": "/v1/completions",
        "status_code": 200,
        "prompt_tokens": 3,
        "completion_tokens": 2,
        "latency_s": 0.1,
        "replica": replica,
    }
    fields.update(kw)
    return RequestRecord(**fields)


async def test_rows_name_their_replica_and_views_aggregate(migrated: str) -> None:
    a, b = SqlSink(migrated), SqlSink(migrated)  # two replicas' sinks, one database
    await a.start()
    await b.start()
    await a.write([_rec(i, "replica-a") for i in range(3)])
    await b.write([_rec(10 + i, "replica-b", status_code=429) for i in range(2)])
    await b.write([_rec(20, None)])  # a row from before the column existed
    await a.close()
    await b.close()
    rows = await run_sql(migrated, "SELECT replica, COUNT(*) FROM request_log GROUP BY 1")
    assert {r[0]: r[1] for r in rows} == {None: 1, "replica-a": 3, "replica-b": 2}
    # the tenant view counts every replica's rows
    tenant = await run_sql(
        migrated, "SELECT tenant, requests, error_requests FROM v_requests_per_tenant_day"
    )
    assert [tuple(r) for r in tenant] == [("acme", 6, 2)]
    engine = create_db_engine(migrated)
    try:
        cols, per_replica = await run_query(engine, "requests_per_replica_day")
    finally:
        await engine.dispose()
    assert cols == ["day", "replica", "requests", "ok_requests", "error_requests", "total_tokens"]
    got = {
        r["replica"]: (r["requests"], r["ok_requests"], r["error_requests"]) for r in per_replica
    }
    assert got == {"replica-a": (3, 3, 0), "replica-b": (2, 0, 2), None: (1, 1, 0)}


async def test_schema_newer_than_this_release_is_refused(migrated: str) -> None:
    (head,) = script_heads()
    await run_sql(
        migrated,
        f"UPDATE alembic_version SET version_num = '0099_future' WHERE version_num = '{head}'",
    )
    engine = create_db_engine(migrated)
    try:
        with pytest.raises(SchemaTooNewError) as info:
            await ensure_schema(engine, auto_migrate=False)
        msg = info.value.message
        assert "0099_future" in msg and head in msg
        assert msg.startswith("database schema is newer than this servehall")
        assert "\n" not in msg
        assert info.value.known_heads == script_heads()
        # auto_migrate (and `servehall db upgrade`) refuse too: never a downgrade
        with pytest.raises(SchemaTooNewError):
            await ensure_schema(engine, auto_migrate=True)
        with pytest.raises(SchemaTooNewError):
            await upgrade_database(engine)
    finally:
        await engine.dispose()
    assert isinstance(info.value, ConfigError)


async def test_commit_wait_returns_once_the_row_is_written(migrated: str, tmp_path: Path) -> None:
    sink = SqlSink(migrated)
    runner = SinkRunner(
        sink, linger_s=0.05, commit_wait_s=10.0, spill_path=tmp_path / "spill.jsonl"
    )
    await runner.start()
    try:
        recs = [_rec(i, "replica-a") for i in range(5)]
        for r in recs:
            runner.put(r)
        done = await asyncio.gather(*(runner.wait_written(r) for r in recs))
        assert done == [True] * 5
        rows = await run_sql(migrated, "SELECT COUNT(*) FROM request_log")
        assert rows[0][0] == 5  # committed before wait_written returned
    finally:
        await runner.close()


class _Broken:
    name = "broken"
    required = False

    async def start(self) -> None: ...

    async def write(self, records: Any) -> None:
        raise ConnectionError("database down")

    async def close(self) -> None: ...


async def test_commit_wait_times_out_and_keeps_the_record(tmp_path: Path) -> None:
    runner = SinkRunner(
        _Broken(),  # type: ignore[arg-type]
        commit_wait_s=0.2,
        retry_initial_s=0.05,
        retry_max_s=0.05,
        close_timeout_s=0.1,
        spill_path=tmp_path / "spill.jsonl",
    )
    await runner.start()
    rec = _rec(1, "replica-a")
    runner.put(rec)
    assert await runner.wait_written(rec) is False
    assert runner.commit_wait_timeouts == 1
    assert runner.pending == 1  # still queued, not dropped
    await runner.close()
    assert "r-1" in (tmp_path / "spill.jsonl").read_text()  # saved for the next start


async def test_commit_wait_zero_never_waits(tmp_path: Path) -> None:
    runner = SinkRunner(_Broken(), spill_path=tmp_path / "s.jsonl", close_timeout_s=0.1)  # type: ignore[arg-type]
    await runner.start()
    rec = _rec(2, None)
    runner.put(rec)
    assert await runner.wait_written(rec) is False
    assert runner.commit_wait_timeouts == 0
    await runner.close()
