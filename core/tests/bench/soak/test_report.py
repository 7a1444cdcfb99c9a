"""The soak's report (servehall.bench.soak.report): the traffic summary lines, the RSS
warm-up and the JSON report."""

from __future__ import annotations

from servehall.bench.soak.clients import Traffic
from servehall.bench.soak.invariants import FaultWindow, InvariantResult, Observation
from servehall.bench.soak.options import SoakOptions
from servehall.bench.soak.report import json_report, rss_warmup_s, summarize_traffic


def _traffic() -> Traffic:
    t = Traffic(duration_s=10.0)
    t.observations = [
        Observation("chat", "/v1/chat/completions", 0.0, 1.0, 200, request_id="a"),
        Observation("chat", "/v1/chat/completions", 0.0, 1.0, 400, request_id="b"),
        Observation("sse", "/v1/chat/completions", 0.0, 1.0, 200, stream_error=503),
    ]
    t.by_category.update({"sdk": 2, "hostile": 1})
    t.faults = [FaultWindow("worker-kill", 1.0, 4.5)]
    return t


def test_the_summary_lines() -> None:
    assert summarize_traffic(_traffic()) == [
        "requests: 3 in 10 s (0.3/s)",
        "by status: 200: 2, 400: 1",
        "by category: hostile: 1, sdk: 2",
        "streams with an error event: 1",
    ]
    assert summarize_traffic(Traffic())[0] == "requests: 0 in 0 s (0.0/s)"


def test_the_warm_up_is_a_quarter_of_the_run_at_most_5_minutes() -> None:
    assert rss_warmup_s(SoakOptions(duration_s=120)) == 30
    assert rss_warmup_s(SoakOptions(duration_s=3600)) == 300


def test_the_json_report() -> None:
    result = InvariantResult("I1", "no 5xx", checked=3)
    result.violations = [f"v{i}" for i in range(1500)]
    doc = json_report(SoakOptions(clients=4), _traffic(), [result])
    assert doc["requests"] == 3 and doc["clients"] == 4
    assert doc["by_status"] == {"200": 2, "400": 1}
    assert doc["faults"] == [{"name": "worker-kill", "window_s": 3.5}]
    assert (doc["rss_baseline_mib"], doc["rss_growth_mib"]) == (0.0, 0.0)
    i1 = doc["invariants"]["I1"]
    assert i1["violation_count"] == 1500 and len(i1["violations"]) == 1000
