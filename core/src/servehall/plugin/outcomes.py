"""What a served version remembers of its recent requests, and why a canary is rolled back.

:class:`OutcomeWindow` is :attr:`ServedModel.outcomes <servehall.plugin.host.ServedModel>`
(the ended requests of one version); :class:`Breach` is what
:attr:`Host.on_canary_rollback <servehall.plugin.host.Host>` receives. They live beside
:class:`~servehall.plugin.host.ServedModel` so the host needs nothing from ``rollout/``;
the guarded canary that fills and judges them is :mod:`servehall.rollout.guard`.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any


class OutcomeWindow:
    """Ended requests of one version over the last ``window_s`` seconds.

    Appends are O(1); old entries leave on the next append or read (amortised O(1)).
    """

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self._items: deque[tuple[float, bool, float | None]] = deque()
        self.judged_at = 0.0

    def add(self, now: float, error: bool, ttft_s: float | None) -> None:
        """One ended request at monotonic ``now``."""
        self._items.append((now, error, ttft_s))
        self.prune(now)

    def prune(self, now: float) -> None:
        """Drop entries older than the window."""
        cutoff = now - self.window_s
        items = self._items
        while items and items[0][0] < cutoff:
            items.popleft()

    @property
    def count(self) -> int:
        """Requests in the window."""
        return len(self._items)

    def errors(self) -> int:
        """Requests in the window that ended in an error."""
        return sum(1 for _, e, _ in self._items if e)

    def error_rate(self) -> float:
        """Errors / requests (0 for an empty window)."""
        n = len(self._items)
        return self.errors() / n if n else 0.0

    def ttfts(self) -> list[float]:
        """TTFTs (seconds) of the requests that produced a token."""
        return [t for _, _, t in self._items if t is not None]


@dataclass(frozen=True, slots=True)
class Breach:
    """Why a canary is rolled back: ``reason`` (``error_rate`` or ``ttft_p99``), a
    one-line ``detail`` and the ``figures`` it was judged on (JSON-able: ``requests``,
    ``errors``, ``error_rate``, ``window_s``, ``min_requests``, the rule's thresholds,
    ``ttft_p99_ms`` and ``baseline_ttft_p99_ms``/``baseline_requests`` for TTFT)."""

    reason: str
    detail: str
    figures: dict[str, Any] = field(default_factory=dict)

    def marker(self, replica: str) -> dict[str, Any]:
        """The ``rolled_back`` table's fields besides ``weight``
        (:class:`~servehall.config.models.RolledBack`)."""
        return {
            "reason": self.reason,
            "detail": self.detail[:500],
            "at": datetime.now(UTC).isoformat(timespec="seconds"),
            "by": replica[:128],
        }
