"""First-come-first-served admission with a concurrency cap and a bounded queue."""

from __future__ import annotations

import collections
import time

from servehall.config.models import SchedulerSettings
from servehall.schedulers.queue import Clock, QueueScheduler, Waiter


class FcfsScheduler(QueueScheduler):
    """FCFS: at most ``max_concurrency`` requests hold a slot; up to ``max_queue`` wait.

    A request arriving to a full queue gets :class:`~servehall.errors.QueueFullError`
    (503 + ``Retry-After``); one waiting longer than ``queue_timeout_s`` gets
    :class:`~servehall.errors.QueueTimeoutError` (503). A waiter cancelled (client gone)
    leaves the queue. Slots are handed over in arrival order, directly from the releasing
    request to the oldest waiter, so a newcomer never overtakes the queue. Shared rules:
    :mod:`servehall.schedulers.queue`.
    """

    name = "fcfs"

    def __init__(self, settings: SchedulerSettings, *, clock: Clock = time.monotonic) -> None:
        super().__init__(settings, clock=clock)
        self._waiters: collections.deque[Waiter] = collections.deque()

    def _push(self, waiter: Waiter) -> None:
        self._waiters.append(waiter)

    def _pop(self) -> Waiter | None:
        return self._waiters.popleft() if self._waiters else None

    def _remove(self, waiter: Waiter) -> None:
        self._waiters.remove(waiter)
