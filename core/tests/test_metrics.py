"""``servehall.metrics``: ``observe_all`` (a batch of observations on one histogram child
gives the same exposition as one ``observe`` per value), ``Metrics.child`` (kept
children), ``Metrics.start_series`` (zero series for every label set known up front) and
``Metrics.render`` (the host's families, then the default registry's)."""

from __future__ import annotations

import math

from prometheus_client import CollectorRegistry, Histogram, generate_latest

from servehall.metrics import observe_all

BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04)


def _pair() -> tuple[CollectorRegistry, Histogram, CollectorRegistry, Histogram]:
    ra, rb = CollectorRegistry(), CollectorRegistry()
    a = Histogram("gap_seconds", "gaps", ["model"], buckets=BUCKETS, registry=ra)
    b = Histogram("gap_seconds", "gaps", ["model"], buckets=BUCKETS, registry=rb)
    return ra, a, rb, b


def _samples(reg: CollectorRegistry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in reg.collect()
        for s in fam.samples
        if not s.name.endswith("_created")
    }


def test_same_counts_and_sum_as_one_observe_per_value() -> None:
    ra, a, rb, b = _pair()
    # on bounds, between them, below the first, above the last (+Inf), repeated runs
    values = [0.001, 0.0025, 0.0007, 0.003, 0.003, 0.003, 0.05, 1.5, 0.04, 0.0, 0.02]
    for v in values:
        a.labels("m").observe(v)
    observe_all(b.labels("m"), values)
    sa, sb = _samples(ra), _samples(rb)
    assert sa.keys() == sb.keys()
    for key, va in sa.items():
        assert math.isclose(va, sb[key], rel_tol=1e-12), key
    assert sb[("gap_seconds_count", (("model", "m"),))] == len(values)
    assert b'gap_seconds_bucket{le="+Inf",model="m"} 11.0' in generate_latest(rb)


def test_empty_batch_changes_nothing() -> None:
    ra, a, rb, b = _pair()
    a.labels("m")
    observe_all(b.labels("m"), [])
    assert _samples(ra) == _samples(rb)


def test_a_child_without_bucket_fields_is_observed_value_by_value() -> None:
    seen: list[float] = []

    class Plain:
        def observe(self, v: float) -> None:
            seen.append(v)

    observe_all(Plain(), [0.1, 0.2])
    assert seen == [0.1, 0.2]


def test_metrics_child_is_the_labelled_child_and_is_kept() -> None:
    from servehall.metrics import Metrics

    m = Metrics()
    a = m.child(m.requests, "demo", "", "chat", "200")
    assert a is m.requests.labels("demo", "", "chat", "200")
    assert m.child(m.requests, "demo", "", "chat", "200") is a
    assert m.child(m.requests, "demo", "", "chat", "400") is not a
    a.inc()
    assert (
        b'servehall_requests_total{endpoint="chat",model="demo",status="200",version=""} 1.0'
        in (m.render())
    )


def test_start_series_exports_zero_series_for_every_known_label_set() -> None:
    from prometheus_client.parser import text_string_to_metric_families

    from servehall.metrics import (
        ABORT_REASONS,
        STRUCTURED_KINDS,
        STRUCTURED_OUTCOMES,
        TOOL_CALL_OUTCOMES,
        Metrics,
    )

    m = Metrics()
    m.start_series([("demo", ""), ("small", "v2")])
    series: dict[str, list[dict[str, str]]] = {}
    from prometheus_client import generate_latest

    # the host's own registry: the default one holds plugins' counters from other tests
    for fam in text_string_to_metric_families(generate_latest(m.registry).decode()):
        for s in fam.samples:
            if s.name.endswith("_total") and s.name.startswith("servehall_"):
                assert s.value == 0.0, s
                series.setdefault(s.name, []).append(dict(s.labels))
    for model, version in (("demo", ""), ("small", "v2")):
        mine = {"model": model, "version": version}
        assert mine in series["servehall_prompt_tokens_total"]
        assert mine in series["servehall_generation_tokens_total"]
        aborts = [d for d in series["servehall_request_aborts_total"] if d["model"] == model]
        assert sorted(d["reason"] for d in aborts) == sorted(ABORT_REASONS)
        calls = [d for d in series["servehall_tool_calls_total"] if d["model"] == model]
        assert sorted(d["outcome"] for d in calls) == sorted(TOOL_CALL_OUTCOMES)
        kinds = [
            d for d in series["servehall_structured_output_requests_total"] if d["model"] == model
        ]
        assert len(kinds) == len(STRUCTURED_KINDS) * len(STRUCTURED_OUTCOMES)
    assert len(series["servehall_prompt_tokens_total"]) == 2  # nothing for unknown models


def test_render_holds_the_hosts_families_then_the_default_registry() -> None:
    from prometheus_client import REGISTRY, Counter

    from servehall.metrics import Metrics

    m = Metrics()
    m.child(m.requests, "demo", "", "/v1/chat/completions", "200").inc(3)
    plugin = Counter("servehall_test_plugin_events", "a plugin's counter", registry=REGISTRY)
    try:
        plugin.inc(2)
        text = m.render().decode()
    finally:
        REGISTRY.unregister(plugin)
    assert "servehall_test_plugin_events_total 2.0" in text
    assert (
        'servehall_requests_total{endpoint="/v1/chat/completions",model="demo",'
        'status="200",version=""} 3.0'
    ) in text
    assert text.index("# HELP servehall_generation_tokens") < text.index(
        "# HELP servehall_test_plugin_events"
    )
    assert "servehall_test_plugin_events" not in Metrics().render().decode()
