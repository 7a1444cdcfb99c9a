"""The soak's report: the traffic summarised in lines, the RSS warm-up, and the JSON
report (``--output-json``)."""

from __future__ import annotations

from collections import Counter
from typing import Any

from servehall.bench.soak.clients import Traffic
from servehall.bench.soak.invariants import InvariantResult
from servehall.bench.soak.options import SoakOptions


def summarize_traffic(traffic: Traffic) -> list[str]:
    """Lines: requests per second, statuses, categories."""
    obs = traffic.observations
    statuses = Counter(o.status for o in obs)
    rate = len(obs) / traffic.duration_s if traffic.duration_s else 0.0
    lines = [
        f"requests: {len(obs)} in {traffic.duration_s:.0f} s ({rate:.1f}/s)",
        "by status: " + ", ".join(f"{s}: {n}" for s, n in sorted(statuses.items())),
        "by category: " + ", ".join(f"{c}: {n}" for c, n in sorted(traffic.by_category.items())),
        f"streams with an error event: {sum(1 for o in obs if o.stream_error is not None)}",
    ]
    if traffic.api_restarts is not None or traffic.api_pids:
        restarts = "unread" if traffic.api_restarts is None else f"{traffic.api_restarts:g}"
        lines.append(
            f"API processes after the traffic: {len(traffic.api_pids)} {traffic.api_pids}; "
            f"restarts: {restarts}"
        )
    return lines


def rss_warmup_s(opts: SoakOptions) -> float:
    """The RSS warm-up: a quarter of the run, at most 5 minutes."""
    return min(300.0, opts.duration_s / 4)


def json_report(
    opts: SoakOptions, traffic: Traffic, results: list[InvariantResult]
) -> dict[str, Any]:
    """The JSON report (``--output-json``): traffic, faults, RSS and each invariant."""
    statuses = Counter(str(o.status) for o in traffic.observations)
    base, growth = 0.0, 0.0
    if traffic.rss:
        from servehall.bench.soak.invariants import rss_growth_mib

        base, growth = rss_growth_mib(traffic.rss, rss_warmup_s(opts))
    return {
        "duration_s": traffic.duration_s,
        "clients": opts.clients,
        "api_processes": opts.api_processes,
        "api_process_restarts": traffic.api_restarts,
        "requests": len(traffic.observations),
        "by_status": dict(statuses),
        "by_category": dict(traffic.by_category),
        "faults": [{"name": w.name, "window_s": w.end - w.start} for w in traffic.faults],
        "rss_baseline_mib": base,
        "rss_growth_mib": growth,
        "invariants": {
            r.key: {
                "title": r.title,
                "checked": r.checked,
                "violation_count": len(r.violations),
                "skipped": r.skipped,
                "notes": r.notes,
                "violations": r.violations[:1000],
            }
            for r in results
        },
    }
