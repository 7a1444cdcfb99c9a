"""Tests of servehall.bench.compare's own logic: target parsing (every kind, option and
error), the grammar counters read from a real ``/metrics`` text over HTTP and their
deltas, and the comparison rows (ratios to the first target, CPU per token, frontend CPU
against the engine target) from real summaries."""

from __future__ import annotations

import functools
import http.server
import threading
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from servehall.bench.compare import (
    Target,
    TargetRun,
    comparison_rows,
    expand_api_processes,
    grammar_counters,
    grammar_delta,
    parse_target,
    run_labels,
)
from servehall.bench.metrics import RequestOutput, summarize
from servehall.bench.runner import RunResult


def test_parse_every_kind() -> None:
    assert parse_target("engine:tiny") == Target("engine:tiny", "engine", model="tiny")
    native = parse_target("engine-native:tiny")
    assert native.kind == "engine" and native.native and native.model == "tiny"
    assert parse_target("vllm-server:m").kind == "vllm-server"
    h1 = parse_target("launch:h1,rf=json")
    assert (h1.kind, h1.http2, h1.response_format) == ("launch", False, "json")
    assert parse_target("launch:h2").http2
    s = parse_target("serve:http://h:8000,h1,pid=42,rf=none")
    assert (s.url, s.http2, s.pid, s.response_format) == ("http://h:8000", False, 42, "none")
    plain = parse_target("serve:https://h")
    assert (plain.http2, plain.pid, plain.response_format, plain.label) == (
        True, None, None, "serve:https://h",
    )  # fmt: skip


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("engine", "is not engine:MODEL"),
        ("serve:", "is not engine:MODEL"),
        ("launch:h3", "launch takes h1 or h2"),
        ("serve:h:8000", "must start with http:// or https://"),
        ("serve:http://h,pid=x", "'pid=x' is not pid=NUMBER"),
        ("serve:http://h,h3", "unknown option 'h3'"),
        ("serve:http://h,rf=xml", "'rf=xml' is not rf=none or rf=json"),
        ("docker:x", "unknown kind 'docker'"),
    ],
)
def test_parse_errors(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_target(text)


METRICS = """\
# HELP servehall_grammar_cache_hits_total hits
servehall_grammar_cache_hits_total{model="m"} 6
servehall_grammar_cache_hits_total{model="other"} 99
servehall_grammar_compile_seconds_count{model="m"} 4
servehall_grammar_compile_seconds_sum{model="m"} 0.9
servehall_grammar_compile_seconds_bucket{model="m",le="0.1"} 1
servehall_grammar_compile_seconds_bucket{model="m",le="0.5"} 3
servehall_grammar_compile_seconds_bucket{model="m",le="+Inf"} 4
"""


@pytest.fixture
def metrics_root(tmp_path: Path) -> Iterator[str]:
    (tmp_path / "metrics").write_text(METRICS)
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path))
    handler.log_message = lambda *a: None  # type: ignore[attr-defined]
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, args=(0.02,), daemon=True).start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


async def test_grammar_counters_read_one_models_lines(metrics_root: str) -> None:
    got = await grammar_counters(SimpleNamespace(model="m", root=metrics_root))
    assert got == {
        "hits": 6.0,
        "misses": 4.0,
        "sum": 0.9,
        "buckets": {"0.1": 1.0, "0.5": 3.0, "+Inf": 4.0},
    }
    # an unreachable server: zeros, not an error
    closed = await grammar_counters(SimpleNamespace(model="m", root="http://127.0.0.1:9"))
    assert closed == {"hits": 0.0, "misses": 0.0, "sum": 0.0, "buckets": {}}


def test_grammar_delta_rates_and_bucket_quantiles() -> None:
    before = {"hits": 1.0, "misses": 1.0, "sum": 0.1, "buckets": {"0.1": 1.0, "0.5": 1.0}}
    buckets = {"0.1": 2.0, "0.5": 4.0, "+Inf": 5.0}
    after = {"hits": 7.0, "misses": 5.0, "sum": 1.1, "buckets": buckets}
    d = grammar_delta(before, after)
    assert d["compiles"] == 4 and d["cache_hits"] == 6
    assert d["cache_hit_rate"] == pytest.approx(0.6)
    assert d["compile_s_sum"] == pytest.approx(1.0)
    assert d["compile_p50_s"] == 0.5  # 1 of 4 in <= 0.1, 3 of 4 in <= 0.5
    assert d["compile_p99_s"] == float("inf")
    # a quantile on a bucket's count exactly: that bucket (2 of 4 in <= 0.1)
    exact = {**after, "misses": 4.0, "buckets": {"0.1": 2.0, "0.5": 4.0}}
    assert grammar_delta({**before, "misses": 0.0, "buckets": {}}, exact)["compile_p50_s"] == 0.1
    zero = {"hits": 0.0, "misses": 0.0, "sum": 0.0, "buckets": {}}
    assert grammar_delta(zero, zero) == {
        "compiles": 0, "cache_hits": 0, "cache_hit_rate": None, "compile_s_sum": 0.0,
        "compile_p50_s": None, "compile_p99_s": None,
    }  # fmt: skip


def _run(spec: str, itl: float, cpu_s: float | None, **kw: Any) -> TargetRun:
    """A run of 2 requests of 10 tokens each over 1 s, ``itl`` s between tokens."""
    outs = [RequestOutput(True, 5, 10, 0.0, 0.1, 0.1 + 9 * itl, [itl] * 9) for _ in range(2)]
    summary = summarize(outs, 1.0, None, cpu_s)
    return TargetRun(parse_target(spec), summary, RunResult(outs, 1.0), cpu_s, **kw)


def test_comparison_rows_ratios_and_cpu_per_token() -> None:
    assert comparison_rows([]) == []
    engine = _run("engine:m", 0.01, 0.002, info={"backend": "null"})
    served = _run(
        "serve:http://h,pid=1", 0.02, 0.005, client_cpu_s=0.001, api_cpu_s=0.003, worker_cpu_s=0.002
    )
    rows = comparison_rows([engine, served])
    e, s = rows
    assert e["target"] == "engine:m" and e["backend"] == "null" and e["sent"] == 2
    assert e["cpu_us_per_token"] == pytest.approx(100.0)  # 0.002 s / 20 tokens
    assert e["frontend_cpu_us_per_token"] is None and e["throughput_ratio"] == 1.0
    assert s["cpu_us_per_token"] == pytest.approx(250.0)
    assert s["frontend_cpu_us_per_token"] == pytest.approx(150.0)  # minus the engine's
    assert s["client_cpu_us_per_token"] == pytest.approx(50.0)
    assert s["api_cpu_us_per_token"] == pytest.approx(150.0)
    assert s["worker_cpu_us_per_token"] == pytest.approx(100.0)
    assert s["worker_vs_engine"] == pytest.approx(1.0)
    assert s["itl_p50_ratio"] == pytest.approx(2.0)
    assert s["e2el_p50_added_ms"] == pytest.approx(90.0)
    # no engine target, no CPU figure: the CPU columns are empty, not errors
    (alone,) = comparison_rows([_run("serve:http://h", 0.02, None)])
    assert alone["cpu_us_per_token"] is None and alone["frontend_cpu_us_per_token"] is None
    assert alone["worker_vs_engine"] is None


def test_a_target_given_twice_keeps_both_runs_apart() -> None:
    runs = [_run("engine:m", 0.01, 0.002), _run("serve:http://h", 0.02, None)]
    runs += [_run("engine:m", 0.03, 0.004), _run("engine:m", 0.01, None)]
    assert run_labels(runs) == ["engine:m", "serve:http://h", "engine:m #2", "engine:m #3"]
    rows = comparison_rows(runs)
    assert [r["target"] for r in rows] == run_labels(runs)
    assert rows[2]["itl_p50_ratio"] == pytest.approx(3.0)  # its own figures, not the first's


def test_api_processes_on_launch_and_vllm_server_targets() -> None:
    t = parse_target("launch:h2,api=4")
    assert (t.kind, t.http2, t.api_processes, t.label) == ("launch", True, 4, "launch:h2,api=4")
    t = parse_target("launch:h1,rf=json,api=2")
    assert (t.http2, t.response_format, t.api_processes) == (False, "json", 2)
    v = parse_target("vllm-server:big,api=8")
    assert (v.kind, v.model, v.api_processes) == ("vllm-server", "big", 8)
    assert parse_target("launch:h2").api_processes is None
    for text, message in [
        ("launch:h2,api=0", r"'api=0' is not api=N with N in 1\.\.64"),
        ("launch:h2,api=x", r"'api=x' is not api=N with N in 1\.\.64"),
        ("launch:h2,api=1,2", r"launch takes h1 or h2"),
        ("engine:m,api=2", r"api=N is for launch: and vllm-server: targets"),
        ("serve:http://h,api=2", r"api=N is for launch: and vllm-server: targets"),
    ]:
        with pytest.raises(ValueError, match=message):
            parse_target(text)


def test_expand_api_processes() -> None:
    targets = ["engine:m", "vllm-server:big", "launch:h2", "launch:h1,api=3"]
    assert expand_api_processes(targets, []) == targets
    assert expand_api_processes(targets, [1, 2]) == [
        "engine:m",
        "vllm-server:big,api=1",
        "launch:h2,api=1",
        "launch:h1,api=3",
        "vllm-server:big,api=2",
        "launch:h2,api=2",
    ]


def test_comparison_rows_name_the_http_processes_cpu() -> None:
    served = _run(
        "launch:h2,api=2", 0.02, 0.005, api_cpu_s=0.003, worker_cpu_s=0.002, frontends_cpu_s=0.001
    )
    (row,) = comparison_rows([served])
    assert row["api_processes"] == 2
    assert row["api_cpu_us_per_token"] == pytest.approx(150.0)  # primary + frontends
    assert row["frontends_cpu_us_per_token"] == pytest.approx(50.0)
    (plain,) = comparison_rows([_run("launch:h2", 0.02, 0.005, api_cpu_s=0.003)])
    assert plain["api_processes"] is None and plain["frontends_cpu_us_per_token"] is None
