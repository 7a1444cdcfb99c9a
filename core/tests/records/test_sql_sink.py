"""The ``sql`` sink, schema, audit chain and views on a real SQLite file and a real
PostgreSQL database (a private database per test on the server of .ci/services.d)."""

from __future__ import annotations

import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from record_fixtures import request_record
from sqlalchemy import text

from servehall import AuditEvent, ConfigError
from servehall.config.settings import Settings, load_settings
from servehall.db import create_db_engine
from servehall.db.migrate import ensure_schema, pending_heads
from servehall.db.testing import run_sql
from servehall.plugin.manager import PluginHost
from servehall.records.bus import open_record_bus
from servehall.records.chain import append_events, verify_chain
from servehall.records.sql_sink import SqlSink

_rec = request_record


def _settings(url: str, tmp_path: Path, **database: Any) -> Settings:
    return load_settings(
        data={
            "database": {"url": url, **database},
            "sinks": [{"name": "sql", "options": {"spill_path": str(tmp_path / "spill.jsonl")}}],
        }
    )


async def test_unmigrated_database_is_refused_with_the_command(db_url: str, tmp_path: Path):
    with pytest.raises(ConfigError, match="servehall db upgrade"):
        await open_record_bus(_settings(db_url, tmp_path), PluginHost([]))


async def test_auto_migrate_then_startup_audit_events(db_url: str, tmp_path: Path):
    settings = _settings(db_url, tmp_path, auto_migrate=True)
    bus = await open_record_bus(settings, PluginHost([]))
    await bus.close()
    engine = create_db_engine(db_url)
    assert await pending_heads(engine) == set()
    await engine.dispose()
    rows = await run_sql(db_url, "SELECT action, actor, details FROM audit_event ORDER BY id")
    assert [r.action for r in rows] == ["config.loaded", "plugins.loaded"]
    assert all(r.actor == "system" for r in rows)
    detail = str(rows[0].details)
    # the database URL is recorded with its password (only) masked, like `config show`
    password = urlsplit(db_url).password
    if password:
        assert f":{password}@" not in detail and ":**********@" in detail
    assert urlsplit(db_url).path in detail


async def test_one_row_per_record_and_text_postgres_rejects(migrated: str, tmp_path: Path):
    sink = SqlSink(migrated)
    await sink.start()
    try:
        nul = _rec(
            1,
            status_code=400,
            error_code="invalid_value",
            finish_reason=None,
            prompt_text="a\x00b \ud83d end",
            filter_verdicts=[{"rule": "x\x00y", "action": "flag", "count": 1}],
        )
        await sink.write([_rec(0), nul, _rec(2, stream=True, finish_reason="client_disconnect")])
        await sink.write([_rec(0)])  # a retried batch never duplicates a row
    finally:
        await sink.close()
    rows = await run_sql(
        migrated,
        "SELECT request_id, status_code, prompt_text, filter_verdicts, stream, received_at "
        "FROM request_log ORDER BY request_id",
    )
    assert [r.request_id for r in rows] == ["req-0", "req-1", "req-2"]
    assert rows[1].prompt_text == "ab \ufffd end"
    assert "x\x00y" not in str(rows[1].filter_verdicts) and "xy" in str(rows[1].filter_verdicts)
    assert bool(rows[2].stream) is True
    assert str(rows[0].received_at).startswith("2026-11-29 12:00:00")


async def test_store_prompts_policy(migrated: str, tmp_path: Path):
    for store in (False, True):
        bus = await open_record_bus(
            _settings(migrated, tmp_path, store_prompts=store), PluginHost([])
        )
        bus.emit(_rec(10 + store, prompt_text="secret plan", completion_text="ok"))
        bus.emit(_rec(20 + store, prompt_text="tenant opted out", store_prompts=False))
        await bus.close()
    rows = await run_sql(
        migrated, "SELECT request_id, prompt_text, completion_text FROM request_log"
    )
    got = {r.request_id: (r.prompt_text, r.completion_text) for r in rows}
    assert got == {
        "req-10": (None, None),
        "req-11": ("secret plan", "ok"),
        "req-20": (None, None),
        "req-21": (None, None),
    }


async def _chain(url: str, n: int) -> None:
    engine = create_db_engine(url)
    async with engine.begin() as conn:
        await append_events(
            conn,
            [
                AuditEvent(
                    action="key.created",
                    actor="admin",
                    target=f"key-{i}",
                    details={"scopes": ["inference"], "api_key": "sk-live-canary", "n": i},
                    at=datetime.now(UTC),
                )
                for i in range(n)
            ],
        )
    await engine.dispose()


async def _verify(url: str) -> Any:
    engine = create_db_engine(url)
    try:
        return await verify_chain(engine)
    finally:
        await engine.dispose()


@pytest.mark.parametrize(
    ("tamper", "bad_id"),
    [
        ("UPDATE audit_event SET target = 'key-x' WHERE id = 3", 3),
        ("DELETE FROM audit_event WHERE id = 3", 4),
        (
            "INSERT INTO audit_event (id, at, actor, action, target, details, prev_hash, hash)"
            " SELECT 100, at, actor, action, target, details, hash,"
            " CASE WHEN substr(hash, 1, 1) = 'f' THEN 'e' ELSE 'f' END || substr(hash, 2)"
            " FROM audit_event WHERE id = 5",
            100,
        ),
        ("DELETE FROM audit_event WHERE id = 5", 5),
    ],
    ids=["edited", "deleted", "inserted", "truncated"],
)
async def test_audit_verify_names_first_bad_row(migrated: str, tamper: str, bad_id: int):
    await _chain(migrated, 5)
    ok = await _verify(migrated)
    assert ok.ok and ok.checked == 5
    rows = await run_sql(migrated, "SELECT details FROM audit_event WHERE id = 1")
    assert "sk-live-canary" not in str(rows[0].details)  # secrets are masked
    engine = create_db_engine(migrated)
    async with engine.begin() as conn:
        await conn.execute(text(tamper))
    await engine.dispose()
    bad = await _verify(migrated)
    assert not bad.ok
    assert bad.bad_id == bad_id, bad


async def test_concurrent_chain_writers_never_fork(migrated: str):
    import asyncio

    await asyncio.gather(*(_chain(migrated, 3) for _ in range(6)))
    res = await _verify(migrated)
    assert res.ok, res
    assert res.checked == 18


async def test_views_answer_the_common_questions(migrated: str):
    sink = SqlSink(migrated)
    await sink.start()
    recs = [_rec(i, latency_s=float(i + 1), ttft_s=0.1 * (i + 1)) for i in range(5)]
    recs += [_rec(10, status_code=503, error_code="queue_full", tenant="beta", latency_s=0.0)]
    recs += [_rec(11, status_code=400, tenant=None, prompt_tokens=0, completion_tokens=0)]
    await sink.write(recs)
    await sink.close()
    per_tenant = await run_sql(
        migrated,
        "SELECT tenant, requests, error_requests, total_tokens FROM v_requests_per_tenant_day",
    )
    assert sorted((tuple(r) for r in per_tenant), key=str) == [
        ("acme", 5, 0, 75),
        ("beta", 1, 1, 15),
        (None, 1, 1, 0),
    ]
    err = await run_sql(
        migrated, "SELECT status_code, requests, share FROM v_error_rate_by_status ORDER BY 1"
    )
    assert [(r.status_code, r.requests) for r in err] == [(200, 5), (400, 1), (503, 1)]
    assert abs(sum(r.share for r in err) - 1.0) < 1e-9
    lat = await run_sql(
        migrated, "SELECT model, requests, latency_p50_s, latency_p99_s FROM v_latency_by_model"
    )
    assert len(lat) == 1 and lat[0].requests == 5
    assert lat[0].latency_p50_s == pytest.approx(3.0)  # both methods agree on the median
    assert 4.9 <= lat[0].latency_p99_s <= 5.0


async def test_ensure_schema_reports_unreachable_database(tmp_path: Path):
    engine = create_db_engine("postgresql+asyncpg://nobody:pw@127.0.0.1:9/none")
    with pytest.raises(ConfigError, match="cannot check the schema") as info:
        await ensure_schema(engine, auto_migrate=False)
    assert "pw" not in str(info.value)
    await engine.dispose()


def test_only_content_errors_make_a_record_suspect():
    from sqlalchemy import exc as sa_exc

    from servehall.records.sql_sink import suspect_row as _bad_data

    orig = Exception("boom")
    assert _bad_data(sa_exc.DataError("INSERT", {}, orig))
    assert _bad_data(sa_exc.IntegrityError("INSERT", {}, orig))
    # a server shutting down / refusing / terminating us is retried, never dropped
    assert not _bad_data(sa_exc.DBAPIError("INSERT", {}, orig))
    assert not _bad_data(sa_exc.OperationalError("INSERT", {}, orig))
    assert not _bad_data(sa_exc.InterfaceError("INSERT", {}, orig))
    # a value the driver cannot bind (or a missing table: the runner's probe tells them
    # apart before anything is quarantined)
    assert _bad_data(sa_exc.ProgrammingError("INSERT", {}, orig))
    assert not _bad_data(ConnectionRefusedError())
    assert not _bad_data(TimeoutError())
