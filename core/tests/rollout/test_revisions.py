"""``servehall.rollout.revisions`` on a real, migrated SQLite file: numbered revisions
with hashes and unified diffs, each audited in the same transaction (the chain stays
valid), ``adopt_same``, concurrent recorders never sharing a number, and refusals."""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from servehall.db import create_db_engine
from servehall.db.migrate import upgrade_database
from servehall.records.chain import verify_chain
from servehall.records.types import AuditEvent
from servehall.rollout import revisions
from servehall.rollout.revisions import text_hash, unified_diff

V1 = '[scheduler]\npolicy = "fcfs"\n'
V2 = '[scheduler]\npolicy = "fair"\n'


@pytest.fixture
async def engine(tmp_path: Path) -> AsyncIterator[AsyncEngine]:
    eng = create_db_engine(f"sqlite+aiosqlite:///{tmp_path / 'rev.db'}")
    await upgrade_database(eng)
    yield eng
    await eng.dispose()


def test_text_hash_and_diff() -> None:
    assert text_hash("é") == hashlib.sha256("é".encode()).hexdigest()
    first = unified_diff("", V1, None, 1)
    assert first.startswith("--- /dev/null\n+++ revision 1\n")
    assert '+policy = "fcfs"\n' in first
    d = unified_diff(V1, V2, 1, 2)
    assert d.startswith("--- revision 1\n+++ revision 2\n")
    assert '-policy = "fcfs"\n' in d and '+policy = "fair"\n' in d
    assert unified_diff(V1, V1, 1, 2) == ""


async def test_empty_history(engine: AsyncEngine) -> None:
    assert await revisions.latest(engine) is None
    assert await revisions.latest_number(engine) == 0
    assert await revisions.history(engine) == []
    assert await revisions.get(engine, 1) is None
    assert await revisions.refusals(engine) == []


async def test_record_numbers_diffs_and_audits(engine: AsyncEngine) -> None:
    r1 = await revisions.record(engine, V1, "toml", "admin")
    r2 = await revisions.record(
        engine, V2, "toml", "x" * 200, action="config.rollback", details={"to": 1}
    )
    assert (r1.revision, r2.revision) == (1, 2)
    assert r2.hash == text_hash(V2) and r2.fmt == "toml"
    assert len(r2.applied_by) == 128
    assert r2.diff == unified_diff(V1, V2, 1, 2)
    assert await revisions.latest_number(engine) == 2
    assert await revisions.latest(engine) == await revisions.get(engine, 2)
    got = await revisions.get(engine, 1)
    assert got is not None and (got.text, got.diff) == (V1, r1.diff)
    assert [r.revision for r in await revisions.history(engine)] == [2, 1]
    assert [r.revision for r in await revisions.history(engine, limit=1)] == [2]
    async with engine.connect() as conn:
        rows = (
            await conn.execute(
                text("SELECT action, actor, target, details FROM audit_event ORDER BY id")
            )
        ).all()
    assert [(r.action, r.target) for r in rows] == [
        ("config.applied", "revision 1"),
        ("config.rollback", "revision 2"),
    ]
    details = json.loads(rows[1].details) if isinstance(rows[1].details, str) else rows[1].details
    assert details == {"revision": 2, "hash": r2.hash, "previous": 1, "to": 1}
    assert (await verify_chain(engine)).ok


async def test_adopt_same_returns_the_newest_instead_of_a_copy(engine: AsyncEngine) -> None:
    r1 = await revisions.record(engine, V1, "toml", "replica-a", action="config.started")
    again = await revisions.record(engine, V1, "toml", "replica-b", adopt_same=True)
    assert again == r1
    copy = await revisions.record(engine, V1, "toml", "replica-b")
    assert copy.revision == 2 and copy.diff == ""
    other = await revisions.record(engine, V2, "toml", "b", adopt_same=True, target="m@v2")
    assert other.revision == 3
    async with engine.connect() as conn:
        last = (await conn.execute(text("SELECT target FROM audit_event ORDER BY id DESC"))).first()
    assert last is not None and last.target == "m@v2"


async def test_concurrent_records_take_distinct_numbers(engine: AsyncEngine) -> None:
    texts = [f"# {i}\n{V1}" for i in range(4)]
    got = await asyncio.gather(*(revisions.record(engine, t, "toml", "r") for t in texts))
    assert sorted(r.revision for r in got) == [1, 2, 3, 4]
    assert (await verify_chain(engine)).checked == 4


async def test_refusals_newest_first(engine: AsyncEngine) -> None:
    for i in range(3):
        await revisions.record_refusal(
            engine,
            AuditEvent("config.refused", "replica-a", f"m@v{i}", {"reason": "probe failed"}),
        )
    await revisions.record(engine, V1, "toml", "admin")  # not a refusal
    got = await revisions.refusals(engine)
    assert [r.target for r in got] == ["m@v2", "m@v1", "m@v0"]
    assert got[0].actor == "replica-a" and got[0].details == {"reason": "probe failed"}
    assert got[0].at is not None
    assert len(await revisions.refusals(engine, limit=2)) == 2
