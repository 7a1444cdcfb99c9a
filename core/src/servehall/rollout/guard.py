"""Guarded canary: a version whose errors or TTFT regress is taken out of rotation.

Each version keeps a sliding window of its finished requests (time, error?, TTFT) fed
by the request record (:meth:`~servehall.serving.request.RequestState.finish`). A
version with ``rollback_if`` (:class:`~servehall.config.models.RollbackIf`) is judged
against the other versions of its name (the baseline) at most once a second: once it
has served ``min_requests`` in the window, an error rate above ``error_rate_above`` or
a TTFT P99 above ``ttft_p99_above_baseline`` × the baseline's P99 sets its weight to 0
— a pin header still reaches it — records the audit event ``model.canary_rollback``,
counts ``servehall_canary_rollbacks_total{model,version,reason}`` and logs a warning.
The decision is per replica (each judges the traffic it served); the config revision is
unchanged until an operator applies a new one.
"""

from __future__ import annotations

import logging
import math
import time
from collections import deque
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from servehall.config.models import RollbackIf
    from servehall.metrics import Metrics
    from servehall.plugin.host import Host, ServedModel

log = logging.getLogger("servehall.rollout")

_JUDGE_EVERY_S = 1.0


class OutcomeWindow:
    """Finished requests of one version over the last ``window_s`` seconds.

    Appends are O(1); old entries leave on the next append or read (amortised O(1)).
    """

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self._items: deque[tuple[float, bool, float | None]] = deque()
        self.judged_at = 0.0

    def add(self, now: float, error: bool, ttft_s: float | None) -> None:
        """One finished request at monotonic ``now``."""
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

    def error_rate(self) -> float:
        """Errors / requests (0 for an empty window)."""
        n = len(self._items)
        return sum(1 for _, e, _ in self._items if e) / n if n else 0.0

    def ttfts(self) -> list[float]:
        """TTFTs (seconds) of the requests that produced a token."""
        return [t for _, _, t in self._items if t is not None]


def p99(values: list[float]) -> float | None:
    """The 99th percentile (nearest rank) of ``values``; None when empty."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.99 * len(ordered)) - 1)]


def breach(
    rule: RollbackIf, canary: OutcomeWindow, baseline: list[OutcomeWindow]
) -> tuple[str, str] | None:
    """``(reason, detail)`` when ``canary`` breaks ``rule`` against ``baseline``, else
    None. Reasons: ``error_rate``, ``ttft_p99``."""
    if canary.count < rule.min_requests:
        return None
    if rule.error_rate_above is not None:
        rate = canary.error_rate()
        if rate > rule.error_rate_above:
            return "error_rate", (
                f"error rate {rate:.3f} > {rule.error_rate_above} over {canary.count} requests"
            )
    if rule.ttft_p99_above_baseline is not None:
        base = [t for w in baseline for t in w.ttfts()]
        mine, theirs = p99(canary.ttfts()), p99(base)
        if mine is not None and theirs is not None and len(base) >= rule.min_requests:
            limit = theirs * rule.ttft_p99_above_baseline
            if mine > limit:
                return "ttft_p99", (
                    f"TTFT P99 {mine * 1000:.1f} ms > {rule.ttft_p99_above_baseline} x "
                    f"baseline {theirs * 1000:.1f} ms"
                )
    return None


def observe(
    host: Host, metrics: Metrics | None, served: ServedModel, error: bool, ttft_s: float | None
) -> None:
    """Note one finished request of ``served`` and judge the guarded versions of its
    name (those with ``rollback_if``)."""
    now = time.monotonic()
    served.outcomes.add(now, error, ttft_s)
    siblings = [s for s in host.models.values() if s.name == served.name]
    for canary in siblings:
        rule = canary.rollback_if
        if rule is None or canary.weight == 0 or canary.state != "serving":
            continue
        if now - canary.outcomes.judged_at < _JUDGE_EVERY_S:
            continue
        canary.outcomes.judged_at = now
        canary.outcomes.window_s = rule.window_s
        canary.outcomes.prune(now)
        baseline = [s.outcomes for s in siblings if s.rollback_if is None]
        for w in baseline:
            w.prune(now)
        found = breach(rule, canary.outcomes, baseline)
        if found is not None:
            roll_back(host, metrics, canary, *found)


def roll_back(
    host: Host, metrics: Metrics | None, canary: ServedModel, reason: str, detail: str
) -> None:
    """Set ``canary``'s weight to 0, audit, count and log it."""
    from servehall.records.types import AuditEvent

    canary.weight = 0.0
    log.warning(
        "canary %s rolled back (weight 0): %s; the baseline versions take its traffic",
        canary.key,
        detail,
    )
    if metrics is not None:
        metrics.canary_rollbacks.labels(canary.name, canary.version, reason).inc()
    if host.records is not None:
        host.records.audit(
            AuditEvent(
                action="model.canary_rollback",
                target=canary.key,
                details={"reason": reason, "detail": detail, "replica": host.replica},
            )
        )
