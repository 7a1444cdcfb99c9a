"""Guarded canary: a version whose errors or TTFT regress is taken out of rotation.

Each version keeps a sliding window of its requests' outcomes (time, error?, TTFT), fed
by every request routed to it when it ends
(:meth:`~servehall.serving.request.RequestState.finish`): answered ones, and those
refused before admission too (503 ``queue_full``/``queue_timeout``, ``records_unavailable``,
a failed on-demand load) — an error is a 5xx or an engine error. A version with
``rollback_if`` (:class:`~servehall.config.models.RollbackIf`) is judged against the
other versions of its name (the baseline) at most once a second: once it has
``min_requests`` in the window, an error rate above ``error_rate_above`` or a TTFT P99
above ``ttft_p99_above_baseline`` × the baseline's P99 sets its weight to 0 — a pin
header still reaches it; never the name's last version with weight — counts
``servehall_canary_rollbacks_total{model,version,reason}`` and logs a warning.

The judgement is per replica (each judges the traffic it served); the rollback is the
deployment's: :attr:`Host.on_canary_rollback <servehall.plugin.host.Host>` (set by the
live config, :class:`~servehall.rollout.live.LiveConfig`) stores it as a config revision
(audited ``model.canary_rollback`` with the reason and the figures) that every replica
applies and that survives restarts (:mod:`servehall.rollout.sticky`). Without it (an
app built without the live config) the audit event goes to the record bus and the
rollback lives in this process only.
"""

from __future__ import annotations

import logging
import math
import time
from typing import TYPE_CHECKING, Any

from servehall.plugin.outcomes import Breach, OutcomeWindow

if TYPE_CHECKING:
    from servehall.config.models import RollbackIf
    from servehall.metrics import Metrics
    from servehall.plugin.host import Host, ServedModel
    from servehall.serving.request import RequestState

log = logging.getLogger("servehall.rollout")

_JUDGE_EVERY_S = 1.0


def p99(values: list[float]) -> float | None:
    """The 99th percentile (nearest rank) of ``values``; None when empty."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.99 * len(ordered)) - 1)]


def breach(rule: RollbackIf, canary: OutcomeWindow, baseline: list[OutcomeWindow]) -> Breach | None:
    """The :class:`Breach` when ``canary`` breaks ``rule`` against ``baseline``, else
    None."""
    if canary.count < rule.min_requests:
        return None
    rate = canary.error_rate()
    figures: dict[str, Any] = {
        "requests": canary.count,
        "errors": canary.errors(),
        "error_rate": round(rate, 4),
        "window_s": canary.window_s,
        "min_requests": rule.min_requests,
    }
    if rule.error_rate_above is not None and rate > rule.error_rate_above:
        figures["error_rate_above"] = rule.error_rate_above
        return Breach(
            "error_rate",
            f"error rate {rate:.3f} > {rule.error_rate_above} over {canary.count} requests",
            figures,
        )
    if rule.ttft_p99_above_baseline is not None:
        base = [t for w in baseline for t in w.ttfts()]
        mine, theirs = p99(canary.ttfts()), p99(base)
        if mine is not None and theirs is not None and len(base) >= rule.min_requests:
            limit = theirs * rule.ttft_p99_above_baseline
            if mine > limit:
                figures.update(
                    ttft_p99_above_baseline=rule.ttft_p99_above_baseline,
                    ttft_p99_ms=round(mine * 1000, 3),
                    baseline_ttft_p99_ms=round(theirs * 1000, 3),
                    baseline_requests=len(base),
                )
                return Breach(
                    "ttft_p99",
                    f"TTFT P99 {mine * 1000:.1f} ms > {rule.ttft_p99_above_baseline} x "
                    f"baseline {theirs * 1000:.1f} ms",
                    figures,
                )
    return None


def observe(
    host: Host, metrics: Metrics | None, served: ServedModel, error: bool, ttft_s: float | None
) -> None:
    """Note one ended request of ``served`` (any outcome; ``error``: a 5xx or an engine
    error) and judge the guarded versions of its name (those with ``rollback_if``)."""
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
        if found is None:
            continue
        if not any(s.weight > 0 and s.state == "serving" for s in siblings if s is not canary):
            log.warning(
                "canary %s breaks its rollback_if (%s) but is the only version of %r "
                "taking traffic: not rolled back",
                canary.key,
                found.detail,
                canary.name,
            )
            continue
        roll_back(host, metrics, canary, found)


class GuardListener:
    """The listener (:class:`~servehall.serving.request.RequestListener`) that shows
    the canary guard every ended request routed to a version — refusals before admission
    (queue full or timeout, records unavailable) included — through :func:`observe`."""

    def __init__(self, metrics: Metrics | None) -> None:
        self.metrics = metrics

    def ended(self, state: RequestState, now: float) -> None:
        """:func:`observe` the request's outcome (nothing before a version was chosen)."""
        if state.served is None:
            return
        rec = state.record
        error = rec.status_code >= 500 or rec.finish_reason == "error"
        observe(state.host, self.metrics, state.served, error, rec.ttft_s)


def roll_back(host: Host, metrics: Metrics | None, canary: ServedModel, found: Breach) -> None:
    """Set ``canary``'s weight to 0 on this replica, count and log it, and hand it to
    :attr:`Host.on_canary_rollback` to store (or, without one, audit it on the bus)."""
    from servehall.records.types import AuditEvent

    canary.weight = 0.0
    log.warning(
        "canary %s rolled back (weight 0): %s; the baseline versions take its traffic",
        canary.key,
        found.detail,
    )
    if metrics is not None:
        metrics.canary_rollbacks.labels(canary.name, canary.version, found.reason).inc()
    if host.on_canary_rollback is not None:
        host.on_canary_rollback(canary, found)
    elif host.records is not None:
        host.records.audit(
            AuditEvent(
                action="model.canary_rollback",
                target=canary.key,
                details=audit_details(found, host.replica),
            )
        )


def audit_details(found: Breach, replica: str) -> dict[str, Any]:
    """The ``model.canary_rollback`` audit event's details: reason, detail, the figures
    and the replica that judged."""
    return {"reason": found.reason, "detail": found.detail, **found.figures, "replica": replica}
