"""Token buckets behind a small store interface.

A :class:`Bucket` is one limit: ``capacity`` units that refill continuously at
``capacity / 60`` units per second (a per-minute limit). Requests-per-minute buckets
count requests, tokens-per-minute buckets count tokens.

:class:`LimiterStore` is the whole interface the rate limiter needs; this module ships
the in-process :class:`MemoryLimiterStore`. A shared store (Redis, PostgreSQL) for
several replicas implements the same three methods, with :meth:`acquire` atomic across
its buckets (e.g. one Lua script).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable


@dataclass(frozen=True, slots=True)
class Bucket:
    """A per-minute limit.

    Attributes:
        key: the store key, e.g. ``p:sh-abc:requests`` or ``t:team-a:tokens``.
        capacity: units per minute (also the burst size).
    """

    key: str
    capacity: float

    @property
    def refill_per_s(self) -> float:
        """Units added per second."""
        return self.capacity / 60.0


@dataclass(frozen=True, slots=True)
class Acquired:
    """Result of :meth:`LimiterStore.acquire`.

    Attributes:
        ok: True when every bucket had enough and was debited; False when none was.
        levels: each bucket's level after the call (``key → units``); may be negative
            after a settle that charged more than reserved.
        retry_after_s: when not ok, seconds until every bucket would have enough
            (``math.inf`` when an amount exceeds a bucket's capacity).
    """

    ok: bool
    levels: dict[str, float]
    retry_after_s: float = 0.0


@runtime_checkable
class LimiterStore(Protocol):
    """Where bucket levels live. All amounts are in the bucket's units."""

    async def acquire(self, charges: Sequence[tuple[Bucket, float]]) -> Acquired:
        """Atomically debit every ``(bucket, amount)`` if all have enough, else none."""
        ...

    async def credit(self, charges: Sequence[tuple[Bucket, float]]) -> None:
        """Add amounts back (capped at capacity); a negative amount debits, unchecked."""
        ...

    async def levels(self, buckets: Sequence[Bucket]) -> dict[str, float]:
        """Current levels without changing them."""
        ...


class MemoryLimiterStore:
    """In-process buckets (one replica).

    Memory stays bounded by the active principals: a bucket that is full again is
    dropped when next touched, and every ``sweep_every`` acquisitions the store drops
    all buckets that have refilled completely.

    Args:
        clock: monotonic seconds (injectable for tests).
        sweep_every: acquisitions between sweeps.
    """

    def __init__(
        self, clock: Callable[[], float] = time.monotonic, sweep_every: int = 1024
    ) -> None:
        self._clock = clock
        self._sweep_every = sweep_every
        self._calls = 0
        # key → (level, at, capacity, refill per second)
        self._state: dict[str, tuple[float, float, float, float]] = {}

    def __len__(self) -> int:
        """Buckets currently held (full ones are not stored)."""
        return len(self._state)

    def _level(self, b: Bucket, now: float) -> float:
        level, at, _, _ = self._state.get(b.key, (b.capacity, now, 0.0, 0.0))
        return min(b.capacity, level + (now - at) * b.refill_per_s)

    def _set(self, b: Bucket, level: float, now: float) -> None:
        if level >= b.capacity:
            self._state.pop(b.key, None)
        else:
            self._state[b.key] = (level, now, b.capacity, b.refill_per_s)

    def _sweep(self, now: float) -> None:
        full = [
            k
            for k, (level, at, cap, rate) in self._state.items()
            if level + (now - at) * rate >= cap
        ]
        for k in full:
            del self._state[k]

    async def acquire(self, charges: Sequence[tuple[Bucket, float]]) -> Acquired:
        """See :meth:`LimiterStore.acquire` (no await inside: atomic in one event loop)."""
        now = self._clock()
        self._calls += 1
        if self._calls % self._sweep_every == 0:
            self._sweep(now)
        current = {b.key: self._level(b, now) for b, _ in charges}
        wait = 0.0
        for b, amount in charges:
            short = amount - current[b.key]
            if short > 0:
                wait = max(wait, math.inf if amount > b.capacity else short / b.refill_per_s)
        if wait > 0:
            return Acquired(False, current, wait)
        for b, amount in charges:
            current[b.key] -= amount
            self._set(b, current[b.key], now)
        return Acquired(True, current)

    async def credit(self, charges: Sequence[tuple[Bucket, float]]) -> None:
        """See :meth:`LimiterStore.credit`."""
        now = self._clock()
        for b, amount in charges:
            self._set(b, min(b.capacity, self._level(b, now) + amount), now)

    async def levels(self, buckets: Sequence[Bucket]) -> dict[str, float]:
        """See :meth:`LimiterStore.levels`."""
        now = self._clock()
        return {b.key: self._level(b, now) for b in buckets}
