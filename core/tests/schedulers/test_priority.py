"""``servehall.schedulers.priority``: the heap key (aged arrival, or strict priority),
FCFS within a level, and lazy removal of cancelled waiters."""

from __future__ import annotations

import asyncio
from typing import Any

from servehall.admission.scheduler import Ticket
from servehall.config.models import SchedulerSettings
from servehall.schedulers.priority import PriorityScheduler
from servehall.schedulers.queue import Grant, Waiter


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def _scheduler(clock: Clock, **kw: Any) -> PriorityScheduler:
    settings = SchedulerSettings(**{"max_concurrency": 1, "max_queue": 1000, **kw})
    return PriorityScheduler(settings, clock=clock)


async def _order(s: PriorityScheduler, held: Grant, tasks: list[asyncio.Task[Grant]]) -> list[str]:
    """Release slots one by one; the request ids in the order they got one."""
    order = []
    held.release()
    for _ in tasks:
        await _settle()
        granted = [t.result() for t in tasks if t.done() and not t.cancelled()]
        grant = next(g for g in granted if g.ticket.request_id not in order)
        order.append(grant.ticket.request_id)
        grant.release()
    return order


def _submit(s: PriorityScheduler, name: str, priority: int) -> asyncio.Task[Grant]:
    return asyncio.ensure_future(s.acquire(Ticket(request_id=name, model="m", priority=priority)))


async def test_strict_priority_and_fcfs_within_a_level() -> None:
    clock = Clock()
    s = _scheduler(clock, aging_s=0)
    held = await s.acquire(Ticket(request_id="h", model="m"))
    tasks = []
    for name, prio in (("low1", 0), ("high1", 5), ("low2", 0), ("high2", 5), ("mid", 2)):
        tasks.append(_submit(s, name, prio))
        clock.now += 1000  # no aging: waiting time does not matter
    await _settle()
    assert await _order(s, held, tasks) == ["high1", "high2", "mid", "low1", "low2"]


async def test_aging_ranks_by_aged_arrival() -> None:
    clock = Clock()
    s = _scheduler(clock, aging_s=10)
    held = await s.acquire(Ticket(request_id="h", model="m"))
    tasks = [_submit(s, "old-low", 0)]  # rank 0
    await _settle()
    clock.now = 25
    tasks.append(_submit(s, "new-high", 2))  # rank 25 - 20 = 5: behind old-low
    clock.now = 26
    tasks.append(_submit(s, "newer-higher", 3))  # rank 26 - 30 = -4: first
    await _settle()
    assert await _order(s, held, tasks) == ["newer-higher", "old-low", "new-high"]


async def test_rank() -> None:
    w = Waiter(Ticket(request_id="r", model="m", priority=3), "t", 0, 50.0)
    assert _scheduler(Clock(), aging_s=0).rank(w) == -3.0
    assert _scheduler(Clock(), aging_s=4).rank(w) == 50.0 - 12.0


async def test_cancelled_waiters_are_skipped_and_compacted() -> None:
    clock = Clock()
    s = _scheduler(clock, aging_s=0)
    held = await s.acquire(Ticket(request_id="h", model="m"))
    keep = _submit(s, "keep", 0)
    gone = [_submit(s, f"g{i}", 1) for i in range(100)]
    await _settle()
    assert len(s._heap) == 101
    for t in gone:
        t.cancel()
    await _settle()
    assert s.waiting == 1
    assert len(s._heap) <= 2 * 1 + 64  # compacted, not 101 entries
    held.release()
    await _settle()
    assert keep.result().ticket.request_id == "keep"
    keep.result().release()
    assert s.running == 0 and s._heap == []


async def test_last_waiter_cancelled_clears_the_heap() -> None:
    s = _scheduler(Clock())
    held = await s.acquire(Ticket(request_id="h", model="m"))
    t = _submit(s, "x", 0)
    await _settle()
    t.cancel()
    await _settle()
    assert s._heap == [] and s.waiting == 0
    held.release()
    assert s.running == 0
