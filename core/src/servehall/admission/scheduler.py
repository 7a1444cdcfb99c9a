"""Admission and scheduling interfaces (step 6 of the request path).

A scheduler decides when an admitted request may start engine work. The host asks for a
slot with :meth:`Scheduler.acquire` and releases it when the request ends; a full queue
raises :class:`~servehall.errors.QueueFullError` (503 + Retry-After), a wait past the
queue timeout raises :class:`~servehall.errors.QueueTimeoutError` (503).

The built-in policies (``fcfs``, ``priority``, ``fair``) live in :mod:`servehall.schedulers`
and are documented in ``docs/scheduling.md``.
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
        prompt_tokens: prompt tokens, charged to the tenant on admission by ``fair``.
    """

    request_id: str
    model: str
    tenant: str | None = None
    principal_id: str | None = None
    priority: int = 0
    cost_tokens: int = 0
    prompt_tokens: int = 0


DEFAULT_TENANT = "default"
"""The tenant of requests whose principal has none (they share one queue and counter)."""


@dataclass(frozen=True, slots=True)
class TenantState:
    """One tenant's scheduler state, for ``/metrics``.

    Attributes:
        waiting: requests queued for a slot.
        running: slots held.
        service_tokens: tokens served since start: prompt tokens of admitted requests plus
            generated tokens so far (unweighted).
        virtual_tokens: the ``fair`` policy's virtual token counter (weighted, lifted);
            None under other policies.
    """

    waiting: int
    running: int
    service_tokens: int
    virtual_tokens: float | None = None


@runtime_checkable
class Slot(Protocol):
    """A granted admission; release exactly once (``release`` is idempotent).

    The built-in slots also offer ``track(generated: Callable[[], int])``: the request
    path passes a function returning the tokens generated so far, which the scheduler
    reads when it decides (never per token). It is optional for other policies' slots.
    """

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
    """A policy a plugin offers: ``factory(settings: SchedulerSettings) -> Scheduler``.

    ``tenant_settings`` lists the keys the policy reads from ``[scheduler.tenants.<name>]``
    (empty: the policy has no tenant sections and ``config check`` refuses them).
    ``settings`` lists the policy-specific ``[scheduler]`` keys it reads (of
    :data:`POLICY_SETTINGS`); ``config check`` refuses the others when they are set.
    """

    name: str
    factory: Callable[..., Scheduler]
    description: str = ""
    tenant_settings: frozenset[str] = frozenset()
    settings: frozenset[str] = frozenset()


POLICY_SETTINGS = frozenset({"aging_s", "burst_slots"})
"""``[scheduler]`` keys that only some policies read (``priority``: ``aging_s``;
``fair``: ``burst_slots``)."""
