"""``servehall.schedulers.queue``: the rules every built-in policy shares (cap, bounded
queues, per-tenant caps, timeouts, cancellation, slot handover, token accounting), checked
on a minimal FIFO policy written on :class:`QueueScheduler` and on the shipped ones."""

from __future__ import annotations

import asyncio
import collections
from typing import Any

import pytest

from servehall.admission.scheduler import DEFAULT_TENANT, TenantState, Ticket
from servehall.config.models import SchedulerSettings, SchedulerTenantSettings
from servehall.errors import QueueFullError, QueueTimeoutError
from servehall.schedulers.queue import Grant, QueueScheduler, Waiter


class Fifo(QueueScheduler):
    """The smallest policy: first come, first served."""

    name = "test-fifo"

    def __init__(self, settings: SchedulerSettings, **kw: Any) -> None:
        super().__init__(settings, **kw)
        self.queue: collections.deque[Waiter] = collections.deque()

    def _push(self, waiter: Waiter) -> None:
        self.queue.append(waiter)

    def _pop(self) -> Waiter | None:
        return self.queue.popleft() if self.queue else None

    def _remove(self, waiter: Waiter) -> None:
        self.queue.remove(waiter)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _ticket(name: str, tenant: str | None = None, prompt: int = 0) -> Ticket:
    return Ticket(request_id=name, model="m", tenant=tenant, prompt_tokens=prompt)


def _settings(**kw: Any) -> SchedulerSettings:
    return SchedulerSettings(**{"max_concurrency": 1, "max_queue": 10, **kw})


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def test_base_policy_hooks_are_abstract() -> None:
    s = QueueScheduler(_settings())
    with pytest.raises(NotImplementedError):
        s._pop()


async def test_free_slot_starts_at_once_and_release_is_idempotent() -> None:
    s = Fifo(_settings(max_concurrency=2))
    a = await s.acquire(_ticket("a", "t1", prompt=5))
    assert isinstance(a, Grant)
    assert (a.tenant, a.queue_time_s, s.running, s.waiting) == ("t1", 0.0, 1, 0)
    b = await s.acquire(_ticket("b"))
    assert b.tenant == DEFAULT_TENANT and s.running == 2
    a.release()
    a.release()
    assert s.running == 1
    b.release()
    assert s.running == 0


async def test_handover_keeps_order_and_measures_queue_time() -> None:
    clock = Clock()
    s = Fifo(_settings(), clock=clock)
    first = await s.acquire(_ticket("a"))
    tasks = [asyncio.ensure_future(s.acquire(_ticket(n))) for n in ("b", "c")]
    await _settle()
    assert s.waiting == 2 and s.running == 1
    clock.now += 2.5
    # A newcomer does not overtake the queue even when a slot was just released.
    first.release()
    late = asyncio.ensure_future(s.acquire(_ticket("d")))
    await _settle()
    b = tasks[0].result()
    assert b.ticket.request_id == "b" and b.queue_time_s == pytest.approx(2.5)
    assert not tasks[1].done() and not late.done()
    assert s.running == 1 and s.waiting == 2
    b.release()
    await _settle()
    assert tasks[1].result().ticket.request_id == "c"
    tasks[1].result().release()
    await _settle()
    late.result().release()
    assert s.running == 0 and s.waiting == 0


async def test_queue_full_and_tenant_caps_send_retry_after() -> None:
    s = Fifo(
        _settings(
            max_queue=3,
            max_queue_per_tenant=1,
            retry_after_s=7,
            tenants={"big": SchedulerTenantSettings(max_queue=2)},
        )
    )
    held = await s.acquire(_ticket("x"))
    waits = [asyncio.ensure_future(s.acquire(_ticket("a", "small")))]
    await _settle()
    with pytest.raises(QueueFullError) as info:
        await s.acquire(_ticket("a2", "small"))
    assert info.value.headers == {"Retry-After": "7"}
    assert "tenant" in info.value.message
    assert s.tenant_queue_cap("small") == 1 and s.tenant_queue_cap("big") == 2
    waits += [asyncio.ensure_future(s.acquire(_ticket(n, "big"))) for n in ("b1", "b2")]
    await _settle()
    assert s.waiting == 3
    with pytest.raises(QueueFullError) as info:
        await s.acquire(_ticket("z", "other"))
    assert "queue is full" in info.value.message
    for w in waits:
        w.cancel()
    await asyncio.gather(*waits, return_exceptions=True)
    assert s.waiting == 0
    held.release()
    assert s.running == 0


async def test_max_queue_zero_refuses_anything_that_would_wait() -> None:
    s = Fifo(_settings(max_queue=0))
    held = await s.acquire(_ticket("a"))
    with pytest.raises(QueueFullError):
        await s.acquire(_ticket("b"))
    held.release()


async def test_timeout_leaves_the_queue() -> None:
    s = Fifo(_settings(queue_timeout_s=0.05, retry_after_s=3))
    held = await s.acquire(_ticket("a"))
    with pytest.raises(QueueTimeoutError) as info:
        await s.acquire(_ticket("b", "t"))
    assert info.value.headers == {"Retry-After": "3"}
    assert "0.05 s" in info.value.message
    assert s.waiting == 0 and "t" not in s.tenant_states()
    held.release()
    assert s.running == 0


async def test_cancelled_waiter_is_never_granted() -> None:
    s = Fifo(_settings())
    held = await s.acquire(_ticket("a"))
    gone = asyncio.ensure_future(s.acquire(_ticket("b")))
    stays = asyncio.ensure_future(s.acquire(_ticket("c")))
    await _settle()
    gone.cancel()
    await _settle()
    assert s.waiting == 1
    held.release()
    await _settle()
    assert stays.result().ticket.request_id == "c"
    assert s.running == 1
    stays.result().release()
    assert s.running == 0


async def test_cancel_after_handover_passes_the_slot_on() -> None:
    s = Fifo(_settings())
    held = await s.acquire(_ticket("a"))
    b = asyncio.ensure_future(s.acquire(_ticket("b")))
    c = asyncio.ensure_future(s.acquire(_ticket("c")))
    await _settle()
    held.release()  # b's future now holds a grant, b's task has not run yet
    b.cancel()
    await _settle()
    assert b.cancelled()  # the grant that came with the cancellation is passed on
    assert c.result().ticket.request_id == "c"
    assert s.running == 1 and s.waiting == 0
    c.result().release()
    assert s.running == 0


async def test_tokens_are_charged_on_sync_and_release() -> None:
    s = Fifo(_settings(max_concurrency=2))
    g = await s.acquire(_ticket("a", "t", prompt=10))
    assert g.generated() == 0
    made = [0]
    g.track(lambda: made[0])
    made[0] = 4
    assert s.tenant_states() == {"t": TenantState(0, 1, 14, None)}
    assert g.charged == 4
    made[0] = 6
    g.release()
    assert s.tenant_states() == {"t": TenantState(0, 0, 16, None)}


def test_weights_and_fair_share() -> None:
    s = Fifo(_settings(max_concurrency=6, tenants={"gold": SchedulerTenantSettings(weight=2)}))
    assert s.weight("gold") == 2 and s.weight("nobody") == 1
    assert s.fair_share("gold") == 6

    assert s.tenant_of(_ticket("x")) == DEFAULT_TENANT
    assert s.tenant_of(_ticket("x", "t")) == "t"


async def test_fair_share_counts_active_tenants_only() -> None:
    s = Fifo(_settings(max_concurrency=6, tenants={"gold": SchedulerTenantSettings(weight=2)}))
    assert s.fair_share("gold") == 6
    silver = await s.acquire(_ticket("s", "silver"))
    assert s.fair_share("silver") == 6
    assert s.fair_share("gold") == pytest.approx(4.0)
    gold = await s.acquire(_ticket("g", "gold"))
    assert s.fair_share("silver") == pytest.approx(2.0)
    silver.release()
    assert s.fair_share("gold") == 6
    gold.release()
