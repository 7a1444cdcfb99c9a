"""Online demand on one replica: how many online (non-batch) requests are asking for or
holding an engine slot, and since when none has.

The batch runner reads it to use idle capacity only (``[batches] preempt``): an online
request that asks for a slot calls the registered listeners at once (the runner stops
its running lines), and no batch line is claimed while :attr:`OnlineDemand.inflight` is
above zero or until :meth:`OnlineDemand.quiet_for` reaches ``[batches] online_quiet_s``.
Counted by :func:`servehall.serving.admit.admit` from before the scheduler's queue to the
slot's release, so a request waiting in the queue counts.

The idea of stopping low-priority work at a step boundary for a waiting request, and
running it again later from its prompt, is vLLM's preemption by recompute (Kwon et al.,
"Efficient Memory Management for Large Language Model Serving with PagedAttention",
SOSP 2023, §4.5).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

log = logging.getLogger("servehall.admission")


class OnlineDemand:
    """Online requests in flight on this replica (see the module docstring).

    Attributes:
        inflight: online requests between :meth:`begin` and :meth:`end` now.
        listeners: called (on the event loop, must not block or raise) by every
            :meth:`begin`, after the count went up.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self.inflight = 0
        self._last_end = float("-inf")
        self.listeners: list[Callable[[], None]] = []

    def begin(self) -> None:
        """An online request asks for a slot: count it and call every listener."""
        self.inflight += 1
        for listener in list(self.listeners):
            try:
                listener()
            except Exception:
                log.exception("an online-demand listener failed")

    def end(self) -> None:
        """An online request let its slot go (or left the queue)."""
        self.inflight = max(0, self.inflight - 1)
        self._last_end = self._clock()

    def quiet_for(self) -> float:
        """Seconds since the last online request ended, 0 while one is in flight
        (``inf`` when none ever ran)."""
        if self.inflight:
            return 0.0
        return self._clock() - self._last_end
