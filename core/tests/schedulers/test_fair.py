"""``servehall.schedulers.fair``: the virtual token counter (charged by weight on
admission and generation), the smallest-counter pick with ties by arrival, the counter
lift of a newly backlogged tenant, and removal of a cancelled waiter."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from servehall.admission.scheduler import Ticket
from servehall.config.models import SchedulerSettings, SchedulerTenantSettings
from servehall.schedulers.fair import FairScheduler
from servehall.schedulers.queue import Grant


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def _fair(**kw: Any) -> FairScheduler:
    return FairScheduler(SchedulerSettings(**{"max_concurrency": 1, "max_queue": 100, **kw}))


def _submit(s: FairScheduler, name: str, tenant: str, prompt: int = 0) -> asyncio.Task[Grant]:
    ticket = Ticket(request_id=name, model="m", tenant=tenant, prompt_tokens=prompt)
    return asyncio.ensure_future(s.acquire(ticket))


async def test_counter_charges_prompt_and_generation_by_weight() -> None:
    s = _fair(
        max_concurrency=2,
        tenants={"gold": SchedulerTenantSettings(weight=2)},
    )
    g = await s.acquire(Ticket(request_id="a", model="m", tenant="gold", prompt_tokens=10))
    made = [0]
    g.track(lambda: made[0])
    assert s.counter("gold") == 5.0
    made[0] = 6
    s.sync()
    assert s.counter("gold") == 8.0
    b = await s.acquire(Ticket(request_id="b", model="m", tenant="plain", prompt_tokens=10))
    assert s.counter("plain") == 10.0
    states = s.tenant_states()
    assert states["gold"].virtual_tokens == 8.0 and states["gold"].service_tokens == 16
    assert states["plain"].virtual_tokens == 10.0
    g.release()
    b.release()


async def test_smallest_counter_first_ties_by_arrival() -> None:
    s = _fair()
    held = await s.acquire(Ticket(request_id="h", model="m", tenant="x", prompt_tokens=0))
    a1 = _submit(s, "a1", "a", prompt=50)
    b1 = _submit(s, "b1", "b", prompt=5)
    a2 = _submit(s, "a2", "a", prompt=5)
    await _settle()
    held.release()
    await _settle()
    # Both counters 0 (lifted to the backlogged minimum 0): the earlier arrival wins.
    assert a1.done() and not b1.done()
    assert s.counter("a") == 50
    a1.result().release()
    await _settle()
    assert b1.done() and not a2.done()  # b (5) is below a (50)
    b1.result().release()
    await _settle()
    assert a2.done()
    a2.result().release()
    assert s.running == 0 and s.waiting == 0


async def test_lift_gives_no_credit_for_idling() -> None:
    s = _fair()
    held = await s.acquire(Ticket(request_id="h", model="m", tenant="busy", prompt_tokens=100))
    wait = _submit(s, "w", "busy", prompt=0)
    await _settle()
    # The newcomer's counter is lifted to the smallest backlogged one (busy: 100).
    late = _submit(s, "l", "idle", prompt=0)
    await _settle()
    assert s.counter("idle") == 100.0
    held.release()
    await _settle()
    assert wait.done()  # tie at 100: earlier arrival
    wait.result().release()
    await _settle()
    late.result().release()
    # Nobody queued: a newcomer is lifted to the tenant that left the queue last.
    s._counter["idle"] = 300.0
    held = await s.acquire(Ticket(request_id="h2", model="m", tenant="x", prompt_tokens=0))
    t = _submit(s, "t", "fresh")
    await _settle()
    assert s.counter("fresh") == 300.0
    held.release()
    await _settle()
    t.result().release()


async def test_cancelled_waiter_is_removed_from_its_tenant_queue() -> None:
    s = _fair()
    held = await s.acquire(Ticket(request_id="h", model="m", tenant="x"))
    gone = _submit(s, "g", "t")
    stays = _submit(s, "s", "u")
    await _settle()
    gone.cancel()
    await _settle()
    assert "t" not in s._queues and s.waiting == 1
    held.release()
    await _settle()
    assert stays.result().ticket.request_id == "s"
    stays.result().release()


async def test_burst_slot_for_a_tenant_below_its_share() -> None:
    s = _fair(max_concurrency=1, burst_slots=1)
    hog = await s.acquire(Ticket(request_id="h", model="m", tenant="hog"))
    newcomer = await asyncio.wait_for(s.acquire(Ticket(request_id="n", model="m", tenant="new")), 1)
    assert s.running == 2
    # No second burst slot, and the hog is at its share: both wait.
    more = _submit(s, "m", "third")
    await _settle()
    assert not more.done()
    newcomer.release()  # above the cap: not handed over
    await _settle()
    assert not more.done() and s.running == 1
    hog.release()
    await _settle()
    assert more.done()
    more.result().release()
    assert s.running == 0


def test_counter_of_an_unknown_tenant_is_zero() -> None:
    assert _fair().counter("nobody") == pytest.approx(0.0)
