"""The FCFS scheduler: concurrency cap, bounded queue, timeouts, cancellation, order."""

from __future__ import annotations

import asyncio

import pytest

from servehall.admission.scheduler import Ticket
from servehall.config.models import SchedulerSettings
from servehall.errors import QueueFullError, QueueTimeoutError
from servehall.schedulers.fcfs import FcfsScheduler


def _t(i: int) -> Ticket:
    return Ticket(request_id=f"r{i}", model="m")


async def test_cap_queue_full_and_fifo_handover() -> None:
    s = FcfsScheduler(SchedulerSettings(max_concurrency=1, max_queue=2, queue_timeout_s=5))
    first = await s.acquire(_t(0))
    order: list[int] = []

    async def wait(i: int) -> None:
        slot = await s.acquire(_t(i))
        order.append(i)
        await asyncio.sleep(0)
        slot.release()

    tasks = [asyncio.create_task(wait(i)) for i in (1, 2)]
    await asyncio.sleep(0.01)
    assert s.waiting == 2 and s.running == 1
    with pytest.raises(QueueFullError) as err:
        await s.acquire(_t(3))
    assert err.value.status == 503 and err.value.headers["Retry-After"] == "1"
    first.release()
    first.release()  # idempotent
    await asyncio.gather(*tasks)
    assert order == [1, 2] and s.running == 0 and s.waiting == 0


async def test_queue_timeout_is_503() -> None:
    s = FcfsScheduler(SchedulerSettings(max_concurrency=1, max_queue=4, queue_timeout_s=0.05))
    held = await s.acquire(_t(0))
    with pytest.raises(QueueTimeoutError) as err:
        await s.acquire(_t(1))
    assert err.value.status == 503 and "Retry-After" in err.value.headers
    assert s.waiting == 0
    held.release()
    assert s.running == 0


async def test_cancelled_waiter_leaves_the_queue() -> None:
    s = FcfsScheduler(SchedulerSettings(max_concurrency=1, max_queue=4, queue_timeout_s=5))
    held = await s.acquire(_t(0))
    waiter = asyncio.create_task(s.acquire(_t(1)))
    await asyncio.sleep(0.01)
    assert s.waiting == 1
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert s.waiting == 0
    held.release()
    assert s.running == 0
    again = await s.acquire(_t(2))
    assert s.running == 1
    again.release()


async def test_release_with_nobody_queued_reads_only_the_released_request() -> None:
    s = FcfsScheduler(SchedulerSettings(max_concurrency=8, max_queue=4, queue_timeout_s=5))
    reads: list[str] = []
    grants = []
    for i, tenant in enumerate(("a", "b", "b")):
        g = await s.acquire(Ticket(request_id=f"r{i}", model="m", tenant=tenant))
        g.track(lambda i=i: reads.append(f"r{i}") or 10 * (i + 1))
        grants.append(g)
    grants[0].release()
    assert reads == ["r0"]  # O(1): the other running requests are not read
    assert s.tenant_states()["a"].service_tokens == 10  # the released one was charged
    reads.clear()
    grants[1].release()
    assert reads == ["r1"]
    # the still-running request is charged at the next sync (a scrape here), once
    assert s.tenant_states()["b"].service_tokens == 20 + 30


async def test_release_with_a_waiter_syncs_every_running_request() -> None:
    s = FcfsScheduler(SchedulerSettings(max_concurrency=2, max_queue=4, queue_timeout_s=5))
    reads: list[str] = []
    held = [await s.acquire(_t(i)) for i in range(2)]
    for i, g in enumerate(held):
        g.track(lambda i=i: reads.append(f"r{i}") or 1)
    waiter = asyncio.create_task(s.acquire(_t(9)))
    await asyncio.sleep(0.01)
    held[0].release()
    assert sorted(reads) == ["r0", "r1"]  # a decision follows: everyone is charged first
    (await waiter).release()
    held[1].release()
