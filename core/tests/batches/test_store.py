"""The batch store on SQLite and PostgreSQL (a real, migrated database): the state
machine, claims taken exactly once by concurrent runners, lapsed claims taken again
(and the lapsed claim's result refused), cancel, expiry; the output-line format; the
stored principal."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from servehall.admission.principal import Limits, Policy, Principal
from servehall.batches.lines import error_of, expired_line, response_line, unrun_line
from servehall.batches.principals import principal_from_json, principal_to_json
from servehall.batches.store import BatchStore, NewLine
from servehall.db import create_db_engine

LEASE = 30.0


@pytest.fixture
async def engine(migrated: str) -> AsyncIterator[AsyncEngine]:
    eng = create_db_engine(migrated)
    try:
        yield eng
    finally:
        await eng.dispose()


def lines(n: int) -> list[NewLine]:
    return [NewLine(i + 1, f"c{i}", json.dumps({"i": i})) for i in range(n)]


async def make(
    store: BatchStore, bid: str, n: int, *, owner: str = "alice", now: datetime | None = None
) -> None:
    now = now or datetime.now(UTC)
    await store.create(
        batch_id=bid,
        owner=owner,
        principal={"id": owner},
        endpoint="/v1/chat/completions",
        input_file_id="file-x",
        completion_window="24h",
        metadata={"k": "v"},
        lines=lines(n),
        now=now,
        expires_at=now + timedelta(hours=24),
    )


async def test_state_machine(engine: AsyncEngine) -> None:
    store = BatchStore(engine)
    now = datetime.now(UTC)
    await make(store, "batch_a", 3)
    got = await store.get("batch_a", "alice")
    assert got is not None and got.status == "validating"
    assert got.counts == {"total": 3, "completed": 0, "failed": 0}
    assert await store.get("batch_a", "bob") is None
    assert await store.claim("r1", 5, now, LEASE) == []  # not in progress yet
    assert await store.start_validated(now) == 1
    claimed = await store.claim("r1", 2, now, LEASE)
    assert [c.custom_id for c in claimed] == ["c0", "c1"] and claimed[0].attempt == 1
    assert await store.finalizable(now, LEASE) == []
    rest = await store.claim("r2", 5, now, LEASE)
    assert [c.custom_id for c in rest] == ["c2"]
    for i, c in enumerate([*claimed, *rest]):
        ok = i != 1
        assert await store.finish(
            c,
            "r1" if c in claimed else "r2",
            ok=ok,
            status_code=200 if ok else 400,
            request_id=f"req-{i}",
            result=f"line-{i}",
            now=now,
        )
    assert await store.finalizable(now, LEASE) == ["batch_a"]
    took = await store.claim_finalize("batch_a", "r1", now, LEASE)
    assert took is not None and took[1] == "completed" and took[0].status == "finalizing"
    assert await store.claim_finalize("batch_a", "r2", now, LEASE) is None  # r1 holds it
    assert await store.results("batch_a") == (["line-0", "line-2"], ["line-1"])
    assert not await store.close("batch_a", "r2", "completed", "file-o", "file-e", now)
    assert await store.close("batch_a", "r1", "completed", "file-o", "file-e", now)
    done = await store.get("batch_a", "alice")
    assert done is not None and done.status == "completed"
    assert done.counts == {"total": 3, "completed": 2, "failed": 1}
    wire = done.wire()
    assert wire["output_file_id"] == "file-o" and wire["error_file_id"] == "file-e"
    assert wire["completed_at"] and wire["finalizing_at"] and wire["in_progress_at"]
    assert wire["metadata"] == {"k": "v"} and wire["object"] == "batch"
    assert await store.finalizable(now, LEASE) == []
    listed, more = await store.page("alice", limit=1)
    assert [b.id for b in listed] == ["batch_a"] and not more


async def test_concurrent_claims_take_each_line_once(engine: AsyncEngine) -> None:
    store = BatchStore(engine)
    now = datetime.now(UTC)
    await make(store, "batch_c", 60)
    await store.start_validated(now)

    async def runner(name: str) -> list[int]:
        mine: list[int] = []
        while batch := await store.claim(name, 4, now, LEASE):
            mine.extend(c.seq for c in batch)
            await asyncio.sleep(0)
        return mine

    got = await asyncio.gather(*(runner(f"r{i}") for i in range(4)))
    seqs = [s for g in got for s in g]
    assert len(seqs) == 60 and len(set(seqs)) == 60


async def test_lapsed_claim_is_taken_again_and_its_result_refused(engine: AsyncEngine) -> None:
    store = BatchStore(engine)
    t0 = datetime.now(UTC)
    await make(store, "batch_l", 1)
    await store.start_validated(t0)
    (first,) = await store.claim("dead", 1, t0, LEASE)
    assert await store.claim("live", 1, t0 + timedelta(seconds=LEASE / 2), LEASE) == []
    later = t0 + timedelta(seconds=LEASE + 1)
    (second,) = await store.claim("live", 1, later, LEASE)
    assert second.seq == first.seq and second.attempt == 2
    kw = {"ok": True, "status_code": 200, "request_id": "r", "result": "x", "now": later}
    assert not await store.finish(first, "dead", **kw)  # type: ignore[arg-type]
    assert await store.finish(second, "live", **kw)  # type: ignore[arg-type]
    much_later = later + timedelta(seconds=10 * LEASE)
    assert await store.claim("other", 1, much_later, LEASE) == []  # a result is final
    # a renewed claim does not lapse; a released line is claimed again
    await make(store, "batch_r", 1)
    await store.start_validated(t0)
    (line,) = await store.claim("a", 1, t0, LEASE)
    await store.renew("a", [line.seq], t0 + timedelta(seconds=LEASE - 1))
    assert await store.claim("b", 1, t0 + timedelta(seconds=LEASE + 1), LEASE) == []
    assert await store.release(line, "a")
    (back,) = await store.claim("b", 1, t0, LEASE)
    assert back.seq == line.seq and back.attempt == 2


async def test_cancel(engine: AsyncEngine) -> None:
    store = BatchStore(engine)
    now = datetime.now(UTC)
    await make(store, "batch_x", 4)
    await store.start_validated(now)
    (running,) = await store.claim("r", 1, now, LEASE)
    assert await store.cancel("batch_x", "bob", now) is None
    got = await store.cancel("batch_x", "alice", now)
    assert got is not None and got[1] and got[0].status == "cancelling"
    again = await store.cancel("batch_x", "alice", now)
    assert again is not None and not again[1]
    assert await store.claim("r", 5, now, LEASE) == []  # nothing new starts
    assert await store.finalizable(now, LEASE) == []  # one line still runs
    assert await store.finish(
        running, "r", ok=True, status_code=200, request_id="q", result="done", now=now
    )
    took = await store.claim_finalize("batch_x", "r", now, LEASE)
    assert took is not None and took[1] == "cancelled" and took[0].status == "cancelling"
    assert await store.results("batch_x") == (["done"], [])
    assert await store.close("batch_x", "r", "cancelled", "file-o", None, now)
    done = await store.get("batch_x", None)
    assert done is not None and done.status == "cancelled" and done.wire()["cancelled_at"]
    assert done.counts == {"total": 4, "completed": 1, "failed": 0}


async def test_expiry(engine: AsyncEngine) -> None:
    store = BatchStore(engine)
    past = datetime.now(UTC) - timedelta(hours=25)
    await make(store, "batch_e", 3, now=past)
    now = datetime.now(UTC)
    assert await store.claim("r", 5, now, LEASE) == []
    assert await store.expire_due(now, LEASE) == 3
    took = await store.claim_finalize("batch_e", "r", now, LEASE)
    assert took is not None and took[1] == "expired"
    out, err = await store.results("batch_e")
    assert out == [] and [json.loads(e)["custom_id"] for e in err] == ["c0", "c1", "c2"]
    assert all(json.loads(e)["error"]["code"] == "batch_expired" for e in err)
    assert await store.close("batch_e", "r", "expired", None, "file-e", now)
    done = await store.get("batch_e", "alice")
    assert done is not None and done.status == "expired" and done.wire()["expired_at"]
    assert done.counts["failed"] == 3


def test_output_lines() -> None:
    ok = json.loads(response_line("a", 200, "chatcmpl-1", {"id": "chatcmpl-1"}))
    assert set(ok) == {"id", "custom_id", "response", "error"}
    assert ok["id"].startswith("batch_req_") and ok["error"] is None
    assert ok["response"] == {
        "status_code": 200,
        "request_id": "chatcmpl-1",
        "body": {"id": "chatcmpl-1"},
    }
    env = {"error": {"message": "no", "type": "invalid_request_error", "param": "x", "code": "bad"}}
    bad = json.loads(response_line("b", 400, "chatcmpl-2", env))
    assert bad["error"] == {"code": "bad", "message": "no"} and bad["response"]["body"] == env
    assert error_of(500, "oops") == {"code": "http_500", "message": "The request failed (500)."}
    gone = json.loads(expired_line("c"))
    assert gone["response"] is None and gone["error"]["code"] == "batch_expired"
    assert json.loads(unrun_line("d", "x", "y"))["error"] == {"code": "x", "message": "y"}


def test_principal_round_trip() -> None:
    p = Principal(
        id="sh-1",
        tenant="t",
        kind="api_key",
        name="n",
        policy=Policy(
            scopes=frozenset({"inference"}),
            models=frozenset({"demo"}),
            limits=Limits(rpm=5, tpm=None),
            store_prompts=False,
            hide_forbidden_models=False,
            priority=3,
            max_priority=7,
        ),
    )
    data = json.loads(json.dumps(principal_to_json(p)))
    assert principal_from_json(data) == p
    anon = Principal(id="anonymous", kind="anonymous")
    assert principal_from_json(principal_to_json(anon)) == anon
