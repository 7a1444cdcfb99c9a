"""What every built-in policy shares: a concurrency cap, bounded queues, timeouts,
cancellation, direct slot handover and per-tenant service accounting.

:class:`QueueScheduler` owns admission; a policy subclass only says which waiter goes
next (:meth:`QueueScheduler._push`, :meth:`_pop`, :meth:`_remove`) and may charge
tokens (:meth:`_admitted`, :meth:`_generated`). Rules every policy keeps:

* at most ``max_concurrency`` slots are held; a request that finds a free slot and an
  empty queue starts at once;
* at most ``max_queue`` requests wait in all, and at most ``max_queue_per_tenant`` (or
  the tenant's own ``[scheduler.tenants.<name>] max_queue``) per tenant; beyond that
  :class:`~servehall.errors.QueueFullError` (503 + ``Retry-After``);
* a wait longer than ``queue_timeout_s`` ends in
  :class:`~servehall.errors.QueueTimeoutError` (503 + ``Retry-After``);
* a waiter cancelled (client gone) leaves the queue and is never granted;
* a released slot goes straight to the waiter the policy picks, so a newcomer never
  overtakes the queue — except, under a policy that allows it (``fair``), a request of a
  tenant with nothing queued that runs fewer requests than its weighted share of
  ``max_concurrency`` (:meth:`QueueScheduler.fair_share`; a tenant with nothing running
  always does), which may take one of ``burst_slots`` slots above the cap; while slots
  above the cap are held, a released slot is not handed over, so the total returns to
  ``max_concurrency``.

Generated tokens reach the scheduler without any per-token call: the request path hands
the slot a function returning its tokens so far (:meth:`Grant.track`), and the scheduler
reads it (:meth:`QueueScheduler.sync`) when it decides and when metrics are scraped. A
release with nobody queued charges only the released request (O(1) instead of reading
every running request), unless the policy counts generated tokens itself
(:meth:`QueueScheduler._generated`, ``fair``): no decision reads the others' counts
before the next sync.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import time
from collections.abc import Callable

from servehall.admission.scheduler import DEFAULT_TENANT, TenantState, Ticket
from servehall.config.models import SchedulerSettings
from servehall.errors import QueueFullError, QueueTimeoutError

Clock = Callable[[], float]


class Waiter:
    """A queued ticket: its tenant, arrival time (clock seconds), arrival number and the
    future that receives its :class:`Grant`."""

    __slots__ = ("arrived", "future", "removed", "seq", "tenant", "ticket")

    def __init__(self, ticket: Ticket, tenant: str, seq: int, arrived: float) -> None:
        self.ticket = ticket
        self.tenant = tenant
        self.seq = seq
        self.arrived = arrived
        self.removed = False
        self.future: asyncio.Future[Grant] = asyncio.get_running_loop().create_future()


class Grant:
    """A held slot (implements :class:`servehall.admission.scheduler.Slot`).

    Attributes:
        ticket: the request's ticket.
        tenant: the tenant charged (``DEFAULT_TENANT`` when the ticket has none).
        queue_time_s: seconds waited for the slot.
        charged: generated tokens already charged to the tenant.
    """

    __slots__ = (
        "_generated",
        "_released",
        "_scheduler",
        "charged",
        "queue_time_s",
        "tenant",
        "ticket",
    )

    def __init__(
        self, scheduler: QueueScheduler, ticket: Ticket, tenant: str, queue_time_s: float
    ) -> None:
        self._scheduler = scheduler
        self._released = False
        self._generated: Callable[[], int] | None = None
        self.ticket = ticket
        self.tenant = tenant
        self.queue_time_s = queue_time_s
        self.charged = 0

    def track(self, generated: Callable[[], int]) -> None:
        """Let the scheduler read this request's generated tokens so far (a cheap
        function; read at scheduling decisions and scrapes, never per token)."""
        self._generated = generated

    def generated(self) -> int:
        """Tokens generated so far (0 until :meth:`track` was called)."""
        return self._generated() if self._generated is not None else 0

    def release(self) -> None:
        """Give the slot back (idempotent); the next waiter the policy picks gets it."""
        if not self._released:
            self._released = True
            self._scheduler._release(self)


class QueueScheduler:
    """Base of the built-in policies (see the module docstring).

    Args:
        settings: the ``[scheduler]`` section.
        clock: monotonic seconds (a fake one in tests); used for arrival times and queue
            time. Queue timeouts use the event loop's own clock.
    """

    name = "queue"
    burst = False
    """Whether ``burst_slots`` (slots above the cap for a tenant below its share)
    applies to this policy (``fair``)."""

    def __init__(self, settings: SchedulerSettings, *, clock: Clock = time.monotonic) -> None:
        self.settings = settings
        self.clock = clock
        self._running = 0
        self._over_cap = 0  # slots held above max_concurrency (burst_slots)
        self._queued = 0
        self._seq = itertools.count()
        self._active: set[Grant] = set()
        self._tenant_waiting: collections.Counter[str] = collections.Counter()
        self._tenant_running: collections.Counter[str] = collections.Counter()
        self._service: collections.Counter[str] = collections.Counter()

    # --- what a policy overrides ---------------------------------------------------------

    def _push(self, waiter: Waiter) -> None:
        """Queue ``waiter``."""
        raise NotImplementedError

    def _pop(self) -> Waiter | None:
        """Remove and return the waiter that gets the next slot (None when none waits)."""
        raise NotImplementedError

    def _remove(self, waiter: Waiter) -> None:
        """Take a cancelled or timed-out waiter out of the queue."""
        raise NotImplementedError

    def _admitted(self, grant: Grant) -> None:
        """Called when ``grant`` is created (charge prompt tokens here)."""

    def _generated(self, grant: Grant, tokens: int) -> None:
        """Called with newly generated tokens of a running request."""

    def _virtual_tokens(self, tenant: str) -> float | None:
        """The tenant's virtual counter (``fair``), else None."""
        return None

    # --- public state ----------------------------------------------------------------------

    @property
    def waiting(self) -> int:
        """Requests queued for a slot."""
        return self._queued

    @property
    def running(self) -> int:
        """Slots currently held."""
        return self._running

    def sync(self) -> None:
        """Charge the tokens running requests generated since the last call."""
        for grant in self._active:
            self._charge(grant)

    def _charge(self, grant: Grant) -> None:
        """Charge the tokens ``grant`` generated since it was last charged."""
        now = grant.generated()
        if now > grant.charged:
            delta = now - grant.charged
            grant.charged = now
            self._service[grant.tenant] += delta
            self._generated(grant, delta)

    def tenant_states(self) -> dict[str, TenantState]:
        """Every tenant seen so far: waiting, running, tokens served (synced first)."""
        self.sync()
        names = set(self._service) | set(self._tenant_waiting) | set(self._tenant_running)
        return {
            t: TenantState(
                waiting=self._tenant_waiting[t],
                running=self._tenant_running[t],
                service_tokens=self._service[t],
                virtual_tokens=self._virtual_tokens(t),
            )
            for t in sorted(names)
        }

    def tenant_of(self, ticket: Ticket) -> str:
        """The tenant a ticket is charged to (``DEFAULT_TENANT`` when it has none)."""
        return ticket.tenant or DEFAULT_TENANT

    def weight(self, tenant: str) -> float:
        """The tenant's ``[scheduler.tenants.<name>] weight`` (1 when it has no section)."""
        own = self.settings.tenants.get(tenant)
        return own.weight if own is not None else 1.0

    def fair_share(self, tenant: str) -> float:
        """``tenant``'s weighted share of ``max_concurrency`` (slots, may be fractional)
        among the active tenants — those running or queueing a request, plus ``tenant``:
        ``max_concurrency * weight(tenant) / sum of their weights``."""
        active = set(self._tenant_running) | set(self._tenant_waiting) | {tenant}
        total = sum(self.weight(t) for t in active)
        return self.settings.max_concurrency * self.weight(tenant) / total

    def tenant_queue_cap(self, tenant: str) -> int | None:
        """The tenant's queue cap: its own ``max_queue``, else ``max_queue_per_tenant``."""
        own = self.settings.tenants.get(tenant)
        if own is not None and own.max_queue is not None:
            return own.max_queue
        return self.settings.max_queue_per_tenant

    # --- admission ---------------------------------------------------------------------------

    def _retry_headers(self) -> dict[str, str]:
        return {"Retry-After": str(self.settings.retry_after_s)}

    def _grant(self, ticket: Ticket, tenant: str, queue_time_s: float) -> Grant:
        grant = Grant(self, ticket, tenant, queue_time_s)
        self._active.add(grant)
        self._tenant_running[tenant] += 1
        self._service[tenant] += ticket.prompt_tokens
        self._admitted(grant)
        return grant

    def _unqueue(self, waiter: Waiter) -> None:
        self._queued -= 1
        self._tenant_waiting[waiter.tenant] -= 1
        if not self._tenant_waiting[waiter.tenant]:
            del self._tenant_waiting[waiter.tenant]

    async def acquire(self, ticket: Ticket) -> Grant:
        """Wait for a slot.

        Raises:
            QueueFullError: the queue, or the tenant's queue, is full (503 + Retry-After).
            QueueTimeoutError: no slot within ``queue_timeout_s`` (503 + Retry-After).
            asyncio.CancelledError: the caller was cancelled; the ticket left the queue.
        """
        tenant = self.tenant_of(ticket)
        if self._running < self.settings.max_concurrency and not self._queued:
            self._running += 1
            return self._grant(ticket, tenant, 0.0)
        if (
            self.burst
            and self._over_cap < self.settings.burst_slots
            and not self._tenant_waiting[tenant]
            and self._tenant_running[tenant] < self.fair_share(tenant)
        ):
            self._running += 1
            self._over_cap += 1
            return self._grant(ticket, tenant, 0.0)
        if self._queued >= self.settings.max_queue:
            raise QueueFullError(
                "The server is at capacity and its queue is full; retry later.",
                headers=self._retry_headers(),
            )
        cap = self.tenant_queue_cap(tenant)
        if cap is not None and self._tenant_waiting[tenant] >= cap:
            raise QueueFullError(
                "Too many of your tenant's requests are queued; retry later.",
                headers=self._retry_headers(),
            )
        waiter = Waiter(ticket, tenant, next(self._seq), self.clock())
        self._queued += 1
        self._tenant_waiting[tenant] += 1
        self._push(waiter)
        fut = waiter.future
        try:
            # asyncio.timeout, not wait_for: on Python 3.11 wait_for returns a grant that
            # arrives with the caller's cancellation, and the gone request keeps its slot
            async with asyncio.timeout(self.settings.queue_timeout_s):
                return await asyncio.shield(fut)
        except TimeoutError:
            if fut.done() and not fut.cancelled():
                return fut.result()  # granted at the last moment: keep it rather than leak
            self._leave(waiter)
            raise QueueTimeoutError(
                f"The request waited longer than {self.settings.queue_timeout_s:g} s "
                "in the queue; retry later.",
                headers=self._retry_headers(),
            ) from None
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                fut.result().release()  # handed a slot we will not use: pass it on
            else:
                self._leave(waiter)
            raise

    def _leave(self, waiter: Waiter) -> None:
        waiter.future.cancel()
        if not waiter.removed:
            waiter.removed = True
            self._remove(waiter)
            self._unqueue(waiter)

    def _release(self, grant: Grant) -> None:
        if self._queued or type(self)._generated is not QueueScheduler._generated:
            self.sync()  # a decision follows, or the policy counts tokens as they come
        else:
            self._charge(grant)  # nothing reads the others' counts before the next sync
        self._active.discard(grant)
        self._tenant_running[grant.tenant] -= 1
        if not self._tenant_running[grant.tenant]:
            del self._tenant_running[grant.tenant]
        if self._over_cap:  # back toward the cap: this slot is not handed over
            self._over_cap -= 1
            self._running -= 1
            return
        while True:
            waiter = self._pop()
            if waiter is None:
                self._running -= 1
                return
            waiter.removed = True
            self._unqueue(waiter)
            if waiter.future.done():  # cancelled but not yet cleaned up
                continue
            # hand the slot over: _running stays the same
            waiter.future.set_result(
                self._grant(waiter.ticket, waiter.tenant, self.clock() - waiter.arrived)
            )
            return
