"""Prometheus counters of the safety filter (default registry).

``servehall_content_filter_blocks_total{rule, stage}``: enforced blocks (a request
refused or a stream ended), by public rule name and stage (``input``/``output``).
``servehall_content_filter_verdicts_total{rule, stage, action, mode}``: every verdict,
``mode`` = ``enforce`` or ``monitor`` (monitored blocks count here, not as blocks).
Matched text is never a label.
"""

from __future__ import annotations

from collections.abc import Iterable

from servehall import FilterVerdict, plugin_counter

BLOCKS = plugin_counter(
    "servehall_content_filter_blocks_total",
    "Requests or streams blocked by a content-filter rule.",
    ("rule", "stage"),
)
VERDICTS = plugin_counter(
    "servehall_content_filter_verdicts_total",
    "Content-filter verdicts by rule, stage, action and mode (enforce/monitor).",
    ("rule", "stage", "action", "mode"),
)


def count(verdicts: Iterable[FilterVerdict]) -> None:
    """Add verdicts to the counters (called once per verdict batch, never per token)."""
    for v in verdicts:
        mode = "monitor" if v.monitor else "enforce"
        VERDICTS.labels(v.rule, v.stage, v.action, mode).inc(v.count)
        if v.action == "block" and not v.monitor:
            BLOCKS.labels(v.rule, v.stage).inc()
