"""First-come-first-served admission with a concurrency cap and a bounded queue."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import time

from servehall.config.models import SchedulerSettings
from servehall.errors import QueueFullError, QueueTimeoutError
from servehall.scheduling import Ticket


class _Slot:
    __slots__ = ("_released", "_scheduler", "queue_time_s")

    def __init__(self, scheduler: FcfsScheduler, queue_time_s: float) -> None:
        self._scheduler = scheduler
        self._released = False
        self.queue_time_s = queue_time_s

    def release(self) -> None:
        if not self._released:
            self._released = True
            self._scheduler._release()


class FcfsScheduler:
    """FCFS: at most ``max_concurrency`` requests hold a slot; up to ``max_queue`` wait.

    A request arriving to a full queue gets :class:`QueueFullError` (503 +
    ``Retry-After``); one waiting longer than ``queue_timeout_s`` gets
    :class:`QueueTimeoutError` (503). A waiter cancelled (client gone) leaves the queue.
    Slots are handed over in arrival order, directly from the releasing request to the
    oldest waiter, so a newcomer never overtakes the queue.
    """

    name = "fcfs"

    def __init__(self, settings: SchedulerSettings) -> None:
        self.settings = settings
        self._running = 0
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()

    @property
    def waiting(self) -> int:
        return sum(1 for w in self._waiters if not w.done())

    @property
    def running(self) -> int:
        return self._running

    def _retry_headers(self) -> dict[str, str]:
        return {"Retry-After": str(self.settings.retry_after_s)}

    async def acquire(self, ticket: Ticket) -> _Slot:
        """Wait for a slot; see the class docstring for errors."""
        start = time.monotonic()
        if self._running < self.settings.max_concurrency and not self.waiting:
            self._running += 1
            return _Slot(self, 0.0)
        if self.waiting >= self.settings.max_queue:
            raise QueueFullError(
                "The server is at capacity and its queue is full; retry later.",
                headers=self._retry_headers(),
            )
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        try:
            await asyncio.wait_for(asyncio.shield(fut), self.settings.queue_timeout_s)
        except TimeoutError:
            if fut.done() and not fut.cancelled():
                # granted at the last moment: keep the slot rather than leak it
                return _Slot(self, time.monotonic() - start)
            fut.cancel()
            raise QueueTimeoutError(
                f"The request waited longer than {self.settings.queue_timeout_s:g} s "
                "in the queue; retry later.",
                headers=self._retry_headers(),
            ) from None
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                self._release()  # we were handed a slot but will not use it
            else:
                fut.cancel()
            raise
        finally:
            with contextlib.suppress(ValueError):  # already handed a slot by _release
                self._waiters.remove(fut)
        return _Slot(self, time.monotonic() - start)

    def _release(self) -> None:
        while self._waiters:
            fut = self._waiters.popleft()
            if not fut.done():
                fut.set_result(None)  # hand the slot over: _running stays the same
                return
        self._running -= 1
