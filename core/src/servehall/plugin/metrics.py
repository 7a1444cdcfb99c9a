"""Prometheus counters for plugins: declared once per process, served on ``/metrics``."""

from __future__ import annotations

from prometheus_client import REGISTRY, Counter


def plugin_counter(name: str, documentation: str, labels: tuple[str, ...]) -> Counter:
    """A ``prometheus_client.Counter`` on the default registry (the one ``/metrics``
    serves), or the counter already registered under ``name``.

    A plugin declares its counters at module level; its module may be imported twice in
    one process (an entry point and a test, a reload), and a second plain ``Counter``
    of the same name would raise. Labels are the label names; ``name`` follows
    Prometheus' rules (a ``_total`` suffix is added on exposition when absent).

    Raises:
        ValueError: ``name`` is registered by a collector that is not a counter.
    """
    existing = REGISTRY._names_to_collectors.get(name)
    if isinstance(existing, Counter):
        return existing
    return Counter(name, documentation, labels)
