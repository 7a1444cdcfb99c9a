"""``servehall.metrics.observe_all``: a batch of observations on one histogram child
gives the same exposition as one ``observe`` per value."""

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
