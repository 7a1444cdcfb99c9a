"""Admission and scheduling interfaces (step 6 of the request path).

A scheduler decides when an admitted request may start engine work. The host asks for a
slot with :meth:`Scheduler.acquire` and releases it when the request ends; a full queue
raises :class:`~servehall.errors.QueueFullError` (503 + Retry-After), a wait past the
queue timeout raises :class:`~servehall.errors.QueueTimeoutError` (503).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable


@dataclass(frozen=True, slots=True)
class Ticket:
    """What a scheduler knows about a request waiting for a slot.

    Attributes:
        request_id: the request's id.
        model: model name.
        tenant: tenant of the principal (fairness key), or None.
        principal_id: principal id, or None.
        priority: larger runs first under the ``priority`` policy (default 0).
        cost_tokens: estimated work: prompt tokens + max_tokens (× n).
    """

    request_id: str
    model: str
    tenant: str | None = None
    principal_id: str | None = None
    priority: int = 0
    cost_tokens: int = 0


@runtime_checkable
class Slot(Protocol):
    """A granted admission; release exactly once (``release`` is idempotent)."""

    queue_time_s: float

    def release(self) -> None:
        """Give the slot back so the next waiting request may start."""
        ...


@runtime_checkable
class Scheduler(Protocol):
    """A scheduling policy for one model's engine."""

    name: str

    async def acquire(self, ticket: Ticket) -> Slot:
        """Wait for a slot. Raises QueueFullError / QueueTimeoutError (503).

        Cancellation (client disconnect) while waiting removes the ticket from the queue.
        """
        ...

    @property
    def waiting(self) -> int:
        """Requests queued for a slot."""
        ...

    @property
    def running(self) -> int:
        """Slots currently held."""
        ...


@dataclass(frozen=True, slots=True)
class SchedulerSpec:
    """A policy a plugin offers: ``factory(settings: SchedulerSettings) -> Scheduler``."""

    name: str
    factory: Callable[..., Scheduler]
    description: str = ""
