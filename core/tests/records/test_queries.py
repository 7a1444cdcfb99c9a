"""``servehall.records.queries``: NAME lookup, ``--since`` parsing, and the named queries
run on a real, migrated SQLite file (since filters on days and on times, limits, plain
values, JSON details decoded)."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from pathlib import Path

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

sys.path.insert(0, str(Path(__file__).parent))
from record_fixtures import request_record

from servehall.db import create_db_engine
from servehall.db.migrate import upgrade_database
from servehall.errors import ConfigError
from servehall.records.chain import append_events
from servehall.records.queries import QUERIES, _plain, find_query, parse_since, run_query
from servehall.records.sql_sink import SqlSink
from servehall.records.types import AuditEvent

DAY1 = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


@pytest.fixture
async def url(tmp_path: Path) -> AsyncIterator[str]:
    url = f"sqlite+aiosqlite:///{tmp_path / 'records.db'}"
    engine = create_db_engine(url)
    await upgrade_database(engine)
    await engine.dispose()
    yield url


@pytest.fixture
async def engine(url: str) -> AsyncIterator[AsyncEngine]:
    eng = create_db_engine(url)
    yield eng
    await eng.dispose()


def test_find_query_accepts_prefix_and_dashes() -> None:
    q = find_query("requests_per_tenant_day")
    assert q.relation == "v_requests_per_tenant_day" and q.since_is_date
    assert find_query("v_requests_per_tenant_day") is q
    assert find_query("requests-per-tenant-day") is q
    assert find_query("audit_events").since_column == "at"
    with pytest.raises(ConfigError) as info:
        find_query("nope")
    assert "unknown query 'nope'" in str(info.value)
    assert all(name in str(info.value) for name in QUERIES)


def test_parse_since() -> None:
    assert parse_since("2026-11-29") == datetime(2026, 11, 29, tzinfo=UTC)
    assert parse_since("2026-11-29T14:00:00+02:00") == datetime(2026, 11, 29, 12, tzinfo=UTC)
    assert parse_since("2026-11-29T12:00:00Z").tzinfo is not None
    with pytest.raises(ConfigError, match="--since 'yesterday'"):
        parse_since("yesterday")


def test_plain_values() -> None:
    assert _plain(Decimal("3")) == 3 and isinstance(_plain(Decimal("3")), int)
    assert _plain(Decimal("0.25")) == 0.25
    assert _plain(date(2026, 1, 2)) == "2026-01-02"
    assert _plain(datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)) == "2026-01-02T03:04:05.000000Z"
    assert _plain("x") == "x" and _plain(None) is None


async def test_requests_per_tenant_day_with_since_and_limit(url: str, engine: AsyncEngine) -> None:
    sink = SqlSink(url)
    await sink.start()
    day = timedelta(days=1)
    await sink.write(
        [
            request_record(1, tenant="acme"),
            request_record(2, tenant="acme"),
            request_record(3, tenant="beta"),
            request_record(4, tenant="acme", received_at=DAY1 + day, finished_at=DAY1 + day),
        ]
    )
    await sink.close()
    cols, rows = await run_query(engine, "requests_per_tenant_day")
    assert "day" in cols and "tenant" in cols
    assert [(r["day"], r["tenant"]) for r in rows] == [
        ("2026-11-29", "acme"),
        ("2026-11-29", "beta"),
        ("2026-11-30", "acme"),
    ]
    assert rows[0]["requests"] == 2
    _, since = await run_query(engine, "requests_per_tenant_day", since=parse_since("2026-11-30"))
    assert [(r["day"], r["tenant"]) for r in since] == [("2026-11-30", "acme")]
    _, limited = await run_query(engine, "requests_per_tenant_day", limit=1)
    assert len(limited) == 1


async def test_audit_events_since_a_time_and_details_decoded(engine: AsyncEngine) -> None:
    async with engine.begin() as conn:
        await append_events(
            conn,
            [
                AuditEvent("key.created", "admin", f"k{i}", {"n": i}, DAY1 + timedelta(hours=i))
                for i in range(3)
            ],
        )
    cols, rows = await run_query(engine, "audit_events")
    assert {"id", "at", "actor", "action", "target", "details"} <= set(cols)
    assert [r["target"] for r in rows] == ["k0", "k1", "k2"]
    assert rows[1]["details"] == {"n": 1}
    since = datetime(2026, 11, 29, 14, 0, tzinfo=UTC)  # between k1 (13:00) and k2 (14:00)
    _, later = await run_query(engine, "audit_events", since=since)
    assert [r["target"] for r in later] == ["k2"]
    _, later = await run_query(engine, "audit_events", since=since - timedelta(hours=1))
    assert [r["target"] for r in later] == ["k1", "k2"]


async def test_unknown_query_is_a_config_error(engine: AsyncEngine) -> None:
    with pytest.raises(ConfigError):
        await run_query(engine, "drop_tables")
