"""Priority admission: higher priority first, FCFS within a level, with aging.

A request's priority comes from its principal (an API key's or JWT's priority, or the
tenant's default) and, when the principal may raise it, from the request's ``priority``
field (:mod:`servehall.serving.priority`). Larger numbers run first.

Aging is the starvation guard: every ``aging_s`` seconds of waiting count as one
priority level. Because every waiter ages at the same rate, the order never changes
while requests wait, so the queue is a heap on a fixed key: a request of priority ``p``
that arrived at ``t`` ranks as if it had arrived at ``t - p * aging_s``. A request of
priority ``p`` therefore waits behind a later request of priority ``q > p`` only while
that one arrived less than ``(q - p) * aging_s`` seconds after it: low priority always
progresses. ``aging_s = 0`` is strict priority (FCFS within a level).
"""

from __future__ import annotations

import heapq
import time

from servehall.config.models import SchedulerSettings
from servehall.schedulers.queue import Clock, QueueScheduler, Waiter


class PriorityScheduler(QueueScheduler):
    """``[scheduler] policy = "priority"`` (see the module docstring); shared rules (cap,
    queue limits, timeouts, cancellation): :mod:`servehall.schedulers.queue`."""

    name = "priority"

    def __init__(self, settings: SchedulerSettings, *, clock: Clock = time.monotonic) -> None:
        super().__init__(settings, clock=clock)
        self._heap: list[tuple[float, int, Waiter]] = []
        self._live = 0

    def rank(self, waiter: Waiter) -> float:
        """The heap key (smaller goes first): aged arrival time, or ``-priority``."""
        aging = self.settings.aging_s
        if not aging:
            return float(-waiter.ticket.priority)
        return waiter.arrived - waiter.ticket.priority * aging

    def _push(self, waiter: Waiter) -> None:
        heapq.heappush(self._heap, (self.rank(waiter), waiter.seq, waiter))
        self._live += 1

    def _pop(self) -> Waiter | None:
        while self._heap:
            _, _, waiter = heapq.heappop(self._heap)
            if not waiter.removed:
                self._live -= 1
                return waiter
        return None

    def _remove(self, waiter: Waiter) -> None:
        # lazy deletion: ``waiter.removed`` is set by the caller; popped later and skipped
        self._live -= 1
        if not self._live:
            self._heap.clear()
        elif len(self._heap) > 2 * self._live + 64:  # many cancelled: compact
            self._heap = [e for e in self._heap if not e[2].removed]
            heapq.heapify(self._heap)
