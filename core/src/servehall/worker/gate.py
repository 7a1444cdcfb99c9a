"""Admission while a model's worker restarts: wait in the queue, then 503 — never hang.

:class:`EngineGate` wraps a model's scheduler. While the engine is up it adds nothing.
While its worker is down, a request waits for it (counted as waiting, up to
``[scheduler] queue_timeout_s``) before asking the policy for a slot; if the engine is
not back in time — or is in a crash loop, or shut down — the request gets
:class:`~servehall.errors.EngineUnavailableError` (503, ``code = engine_unavailable``,
``Retry-After``) naming the reason. The wait counts in the request's queue time.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Protocol

from servehall.admission.scheduler import Scheduler, Slot, Ticket
from servehall.config.models import SchedulerSettings
from servehall.errors import EngineUnavailableError


class Restartable(Protocol):
    """What the gate needs of an engine (``ProcessEngine`` has it)."""

    @property
    def worker_up(self) -> bool: ...

    @property
    def state_reason(self) -> str: ...

    async def wait_up(self, timeout: float) -> bool: ...


class _GatedSlot:
    __slots__ = ("_inner", "queue_time_s")

    def __init__(self, inner: Slot, waited_s: float) -> None:
        self._inner = inner
        self.queue_time_s = inner.queue_time_s + waited_s

    def release(self) -> None:
        self._inner.release()

    def track(self, generated: Callable[[], int]) -> None:
        """Pass the request's generated-token counter on to the policy's slot (the
        ``fair`` policy charges tenants with it); a no-op for policies without one."""
        track = getattr(self._inner, "track", None)
        if track is not None:
            track(generated)


class EngineGate:
    """A :class:`~servehall.admission.scheduler.Scheduler` that first waits for the engine (above).

    Args:
        inner: the model's scheduling policy.
        engine: the model's engine.
        name: the model name (for the error message).
        settings: ``[scheduler]`` (``queue_timeout_s``, ``retry_after_s``).
    """

    def __init__(
        self, inner: Scheduler, engine: Restartable, name: str, settings: SchedulerSettings
    ) -> None:
        self.inner = inner
        self.engine = engine
        self.model = name
        self.settings = settings
        self.name = inner.name
        self._gated = 0

    @property
    def waiting(self) -> int:
        return self.inner.waiting + self._gated

    @property
    def running(self) -> int:
        return self.inner.running

    def __getattr__(self, name: str) -> Any:
        """Everything else (e.g. ``tenant_states`` for metrics and health) is the policy's."""
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    async def acquire(self, ticket: Ticket) -> Slot:
        """Wait for the engine (if down), then for a slot of the inner policy.

        Raises:
            EngineUnavailableError: the engine was not back within ``queue_timeout_s``.
            QueueFullError, QueueTimeoutError: from the inner policy.
        """
        if self.engine.worker_up:
            return await self.inner.acquire(ticket)
        start = time.monotonic()
        self._gated += 1
        try:
            up = await self.engine.wait_up(self.settings.queue_timeout_s)
        finally:
            self._gated -= 1
        if not up:
            raise EngineUnavailableError(
                f"The engine of model '{self.model}' is unavailable: {self.engine.state_reason}",
                headers={"Retry-After": str(self.settings.retry_after_s)},
            )
        slot = await self.inner.acquire(ticket)
        return _GatedSlot(slot, time.monotonic() - start)
