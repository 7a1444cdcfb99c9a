"""``servehall.records.chain``: the canonical content and hash of an audit row, appends
that skip a replayed ``event_id`` and chain to the last row written, and the checks of
:func:`verify_chain` (on a real, migrated SQLite file)."""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from servehall.db import create_db_engine
from servehall.db.migrate import upgrade_database
from servehall.db.models import GENESIS_HASH
from servehall.records.chain import append_events, canonical, chain_hash, verify_chain
from servehall.records.types import AuditEvent

AT = datetime(2026, 12, 1, 8, 30, 0, 123456, tzinfo=UTC)


@pytest.fixture
async def engine(tmp_path: Path) -> AsyncIterator[AsyncEngine]:
    eng = create_db_engine(f"sqlite+aiosqlite:///{tmp_path / 'audit.db'}")
    await upgrade_database(eng)
    yield eng
    await eng.dispose()


def _event(i: int, **kw: object) -> AuditEvent:
    fields: dict[str, object] = {
        "action": "key.created",
        "actor": "admin",
        "target": f"key-{i}",
        "details": {"n": i},
        "at": AT + timedelta(seconds=i),
    }
    fields.update(kw)
    return AuditEvent(**fields)  # type: ignore[arg-type]


def test_canonical_is_sorted_compact_utf8_with_utc_time() -> None:
    plus2 = timezone(timedelta(hours=2))
    got = canonical(AT.astimezone(plus2), "admin", "key.created", None, {"b": 1, "a": "é"})
    assert (
        got
        == (
            '{"action":"key.created","actor":"admin","at":"2026-12-01T08:30:00.123456Z",'
            '"details":{"a":"é","b":1},"target":null}'
        ).encode()
    )
    # A naive time is read as UTC.
    assert canonical(AT.replace(tzinfo=None), "a", "b", "t", {}) == canonical(AT, "a", "b", "t", {})


def test_chain_hash() -> None:
    content = b'{"x":1}'
    assert (
        chain_hash(GENESIS_HASH, content)
        == hashlib.sha256(GENESIS_HASH.encode() + content).hexdigest()
    )
    assert chain_hash("a" * 64, content) != chain_hash(GENESIS_HASH, content)


async def test_empty_chain_verifies(engine: AsyncEngine) -> None:
    async with engine.begin() as conn:
        assert await append_events(conn, []) == 0
    res = await verify_chain(engine)
    assert res.ok and res.checked == 0


async def test_rows_link_from_genesis(engine: AsyncEngine) -> None:
    events = [_event(i) for i in range(3)]
    async with engine.begin() as conn:
        assert await append_events(conn, events) == 3
    async with engine.connect() as conn:
        rows = (
            await conn.execute(
                text("SELECT event_id, prev_hash, hash FROM audit_event ORDER BY id")
            )
        ).all()
        head = (await conn.execute(text("SELECT last_hash, events FROM audit_chain_head"))).one()
    assert [r.event_id for r in rows] == [e.event_id for e in events]
    assert rows[0].prev_hash == GENESIS_HASH
    assert rows[1].prev_hash == rows[0].hash and rows[2].prev_hash == rows[1].hash
    first = events[0]
    assert first.at is not None
    assert rows[0].hash == chain_hash(
        GENESIS_HASH,
        canonical(first.at, first.actor, first.action, first.target, first.details),
    )
    assert (head.last_hash, head.events) == (rows[2].hash, 3)


async def test_replayed_events_are_skipped_and_the_chain_stays_valid(engine: AsyncEngine) -> None:
    batch = [_event(0), _event(1)]
    async with engine.begin() as conn:
        assert await append_events(conn, batch) == 2
    # A spill batch replayed after a crash, with one new event after the old ones.
    async with engine.begin() as conn:
        assert await append_events(conn, [*batch, _event(2)]) == 1
    async with engine.begin() as conn:
        assert await append_events(conn, batch) == 0
    res = await verify_chain(engine)
    assert res.ok and res.checked == 3


async def test_verify_pages_through_the_chain(engine: AsyncEngine) -> None:
    async with engine.begin() as conn:
        await append_events(conn, [_event(i) for i in range(7)])
    res = await verify_chain(engine, page=2)
    assert res.ok and res.checked == 7
    async with engine.begin() as conn:
        await conn.execute(text("UPDATE audit_event SET actor = 'mallory' WHERE id = 6"))
    res = await verify_chain(engine, page=2)
    assert not res.ok and res.bad_id == 6 and res.checked == 5
    assert "hash does not match" in res.reason


async def test_verify_detects_a_truncated_tail_and_an_edited_head(engine: AsyncEngine) -> None:
    async with engine.begin() as conn:
        await append_events(conn, [_event(i) for i in range(3)])
    async with engine.begin() as conn:
        await conn.execute(text("DELETE FROM audit_event WHERE id = 3"))
    res = await verify_chain(engine)
    assert not res.ok and res.checked == 2 and res.bad_id == 3
    assert "audit_chain_head records id 3 and 3 event(s)" in res.reason
    async with engine.begin() as conn:
        await conn.execute(text("DELETE FROM audit_chain_head"))
    res = await verify_chain(engine)
    assert not res.ok and res.reason == "audit_chain_head row is missing"


async def test_verify_detects_a_deleted_middle_row(engine: AsyncEngine) -> None:
    async with engine.begin() as conn:
        await append_events(conn, [_event(i) for i in range(3)])
    async with engine.begin() as conn:
        await conn.execute(text("DELETE FROM audit_event WHERE id = 2"))
    res = await verify_chain(engine)
    assert not res.ok and res.bad_id == 3 and res.checked == 1
    assert "prev_hash does not match" in res.reason
