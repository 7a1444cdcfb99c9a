"""Token-weighted fair queueing across tenants: the Virtual Token Counter (VTC).

Sheng et al., "Fairness in Serving Large Language Models", OSDI 2024. Each tenant has a
virtual token counter ``c``: the service it received, divided by its weight
(``[scheduler.tenants.<name>] weight``, default 1). When a slot frees, the tenant with
the smallest counter among those with queued requests gets it (FCFS within a tenant);
ties go to the earliest arrival.

* Admission charges the prompt: ``c += prompt_tokens / weight``.
* Generation is charged as it happens: ``c += generated / weight``. The request path
  hands each slot a function returning its tokens so far, read at every decision and
  scrape (:meth:`QueueScheduler.sync`), so a long generation is charged while it runs
  at no per-token cost.
* Counter lift: a tenant that becomes backlogged (its queue was empty) gets
  ``c = max(c, min(c of backlogged tenants))``, or, when nobody is queued,
  ``max(c, c of the tenant that left the queue last)``: no credit for idling.
* Requests without a tenant share :data:`~servehall.admission.scheduler.DEFAULT_TENANT`.
* ``[scheduler] burst_slots = N`` (default 0): a tenant with nothing queued that runs
  fewer requests than its weighted share of ``max_concurrency`` (a tenant with nothing
  running always does) may start a request on one of N slots above ``max_concurrency``
  instead of waiting for a slot to free (VTC picks *who* gets the next slot; with long
  requests holding every slot, *when* a slot frees is what such a tenant waits for).

Bound (the paper's Theorem 4.4, with prompt and output tokens costing 1): while two
tenants stay backlogged, their weighted service differs by at most about
``2 * max(prompt_tokens + max_tokens)`` of one request (plus, with a concurrency cap,
what the slots held at that moment are still owed).
"""

from __future__ import annotations

import collections
import time

from servehall.config.models import SchedulerSettings
from servehall.schedulers.queue import Clock, Grant, QueueScheduler, Waiter


class FairScheduler(QueueScheduler):
    """``[scheduler] policy = "fair"`` (see the module docstring); shared rules (cap,
    queue limits, timeouts, cancellation): :mod:`servehall.schedulers.queue`."""

    name = "fair"
    burst = True

    def __init__(self, settings: SchedulerSettings, *, clock: Clock = time.monotonic) -> None:
        super().__init__(settings, clock=clock)
        self._queues: dict[str, collections.deque[Waiter]] = {}
        self._counter: collections.defaultdict[str, float] = collections.defaultdict(float)
        self._last_left: str | None = None

    def counter(self, tenant: str) -> float:
        """The tenant's virtual token counter (weighted tokens)."""
        return float(self._counter[tenant])

    def _virtual_tokens(self, tenant: str) -> float | None:
        return self.counter(tenant)

    def _push(self, waiter: Waiter) -> None:
        t = waiter.tenant
        queue = self._queues.get(t)
        if not queue:
            backlogged = [self._counter[u] for u, q in self._queues.items() if q]
            if backlogged:
                floor = min(backlogged)
            elif self._last_left is not None:
                floor = self._counter[self._last_left]
            else:
                floor = 0.0
            self._counter[t] = max(self._counter[t], floor)
            queue = self._queues[t] = collections.deque()
        queue.append(waiter)

    def _pop(self) -> Waiter | None:
        best: tuple[float, int] | None = None
        chosen: str | None = None
        for t, q in self._queues.items():
            if q:
                key = (self._counter[t], q[0].seq)
                if best is None or key < best:
                    best, chosen = key, t
        if chosen is None:
            return None
        queue = self._queues[chosen]
        waiter = queue.popleft()
        if not queue:
            del self._queues[chosen]
            self._last_left = chosen
        return waiter

    def _remove(self, waiter: Waiter) -> None:
        queue = self._queues.get(waiter.tenant)
        if queue is not None:
            queue.remove(waiter)
            if not queue:
                del self._queues[waiter.tenant]

    def _admitted(self, grant: Grant) -> None:
        self._counter[grant.tenant] += grant.ticket.prompt_tokens / self.weight(grant.tenant)

    def _generated(self, grant: Grant, tokens: int) -> None:
        self._counter[grant.tenant] += tokens / self.weight(grant.tenant)
