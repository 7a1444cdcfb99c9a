"""``servehall bench`` arithmetic: percentiles, vLLM metric definitions, goodput, SLO
parsing, arrivals and the concurrency cap — against hand-computed values."""

from __future__ import annotations

import asyncio
import itertools
import math

import pytest

from servehall.bench.metrics import (
    RequestOutput,
    parse_slo,
    percentile,
    summarize,
    throughput_series,
)
from servehall.bench.runner import run_workload
from servehall.bench.workload import BenchRequest, WorkloadError, arrival_offsets, build_requests


def test_percentile_interpolates_linearly_between_ranks() -> None:
    xs = [4.0, 1.0, 3.0, 2.0]  # sorted: 1 2 3 4, ranks 0..3
    assert percentile(xs, 50) == pytest.approx(2.5)  # rank 1.5
    assert percentile(xs, 90) == pytest.approx(3.7)  # rank 2.7
    assert percentile(xs, 99) == pytest.approx(3.97)  # rank 2.97
    assert percentile(xs, 0) == 1.0
    assert percentile(xs, 100) == 4.0
    assert percentile([7.0], 99) == 7.0


def test_percentile_refuses_empty_input_and_bad_p() -> None:
    with pytest.raises(ValueError):
        percentile([], 50)
    with pytest.raises(ValueError):
        percentile([1.0], 101)


def _outputs() -> list[RequestOutput]:
    return [
        # 5 tokens: TTFT 100 ms, E2E 500 ms -> TPOT (500-100)/4 = 100 ms
        RequestOutput(True, 10, 5, 0.0, 0.1, 0.5, [0.1, 0.1, 0.1, 0.1]),
        # 3 tokens: TTFT 200 ms, E2E 600 ms -> TPOT 400/2 = 200 ms
        RequestOutput(True, 20, 3, 0.0, 0.2, 0.6, [0.2, 0.2]),
        # 1 token: no TPOT sample (goodput treats it as 0)
        RequestOutput(True, 5, 1, 0.0, 0.3, 0.3, []),
        RequestOutput(False, 7, 0, 0.0, status=401, error="HTTP 401: bad key"),
    ]


def test_summary_follows_vllm_definitions() -> None:
    s = summarize(_outputs(), duration_s=2.0)
    assert (s.completed, s.failed, s.failures) == (3, 1, {"HTTP 401": 1})
    assert (s.total_input_tokens, s.total_output_tokens) == (35, 9)  # failed request excluded
    assert s.request_throughput == pytest.approx(1.5)
    assert s.output_throughput == pytest.approx(4.5)
    assert s.total_token_throughput == pytest.approx(22.0)
    # TTFT 100, 200, 300 ms
    assert s.ttft_ms.mean == pytest.approx(200)
    assert s.ttft_ms.median == pytest.approx(200)
    assert s.ttft_ms.percentiles["p90"] == pytest.approx(280)
    assert s.ttft_ms.percentiles["p99"] == pytest.approx(298)
    assert s.ttft_ms.std == pytest.approx(math.sqrt(20000 / 3))
    # TPOT 100, 200 ms (the one-token request has none)
    assert s.tpot_ms.count == 2
    assert s.tpot_ms.mean == pytest.approx(150)
    assert s.tpot_ms.percentiles["p90"] == pytest.approx(190)
    # ITL pooled: 100 x4, 200 x2
    assert s.itl_ms.count == 6
    assert s.itl_ms.mean == pytest.approx(800 / 6)
    assert s.itl_ms.median == pytest.approx(100)
    assert s.itl_ms.percentiles["p90"] == pytest.approx(200)
    # E2E 300, 500, 600 ms
    assert s.e2el_ms.median == pytest.approx(500)
    assert s.e2el_ms.percentiles["p90"] == pytest.approx(580)
    assert s.e2el_ms.percentiles["p99"] == pytest.approx(598)
    assert s.goodput is None and s.good_completed is None


@pytest.mark.parametrize(
    ("slo", "good"),
    [
        ({"ttft": 250, "tpot": 150}, 1),  # B's TPOT 200 > 150, C's TTFT 300 > 250
        ({"e2el": 500}, 2),  # limits are inclusive: A (500) and C (300)
        ({"tpot": 50}, 1),  # only C, whose TPOT counts as 0
        ({"ttft": 1000, "tpot": 1000, "e2el": 1000}, 3),  # the failed request never counts
        ({"ttft": 50}, 0),
    ],
)
def test_goodput_counts_requests_within_every_slo(slo: dict[str, float], good: int) -> None:
    s = summarize(_outputs(), duration_s=2.0, slo=slo)
    assert s.good_completed == good
    assert s.goodput == pytest.approx(good / 2.0)
    assert s.slo == slo


def test_empty_metrics_are_zero_and_duration_must_be_positive() -> None:
    s = summarize([RequestOutput(False, error="ConnectError: refused")], duration_s=1.0)
    assert s.completed == 0 and s.failures == {"ConnectError": 1}
    assert s.ttft_ms.mean == 0 and s.itl_ms.percentiles["p99"] == 0
    with pytest.raises(ValueError):
        summarize([], duration_s=0.0)


def test_parse_slo() -> None:
    assert parse_slo("ttft=500,tpot=50") == {"ttft": 500.0, "tpot": 50.0}
    assert parse_slo("ttft:300 e2el:2000") == {"ttft": 300.0, "e2el": 2000.0}  # vLLM spelling
    assert parse_slo(None) == {} and parse_slo(" ") == {}
    for bad in ("itl=5", "ttft=-1", "ttft=abc", "ttft", "ttft=1,ttft=2", "ttft=inf"):
        with pytest.raises(ValueError):
            parse_slo(bad)


def test_throughput_series_counts_every_token_once() -> None:
    outs = [
        RequestOutput(True, 1, 4, 0.0, 0.1, 0.9, [0.2] * 3, token_times=[0.1, 0.3, 0.5, 0.9]),
        RequestOutput(True, 1, 6, 0.0, 0.1, 0.5, [0.4], token_times=[0.1, 0.5]),  # 3 per chunk
    ]
    xs, ys = throughput_series(outs, duration_s=1.0, bins=4)
    width = 0.25
    assert xs == pytest.approx([0.125, 0.375, 0.625, 0.875])
    assert [y * width for y in ys] == pytest.approx([4.0, 1.0, 4.0, 1.0])


def test_arrivals_are_seeded_poisson_with_the_asked_rate() -> None:
    a = arrival_offsets(4000, 20.0, seed=3)
    assert a == arrival_offsets(4000, 20.0, seed=3)
    assert a[0] == 0.0 and all(x <= y for x, y in itertools.pairwise(a))
    mean_gap = a[-1] / (len(a) - 1)
    assert mean_gap == pytest.approx(1 / 20, rel=0.08)
    assert arrival_offsets(3, math.inf) == [0.0, 0.0, 0.0]
    with pytest.raises(WorkloadError):
        arrival_offsets(3, 0.0)


def test_workload_errors_are_one_line() -> None:
    with pytest.raises(WorkloadError, match="unknown dataset 'nope'"):
        build_requests("nope", 3)
    with pytest.raises(WorkloadError, match="at least 1"):
        build_requests("random", 0)
    with pytest.raises(WorkloadError, match="does not exist"):
        build_requests("sharegpt", 2, dataset_path=__import__("pathlib").Path("/nonexistent.json"))


def test_sharegpt_takes_first_turns_and_cycles(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import json

    data = [
        {
            "conversations": [
                {"from": "human", "value": "hello there"},
                {"from": "gpt", "value": "a b c"},
            ]
        },
        {"conversations": [{"from": "human", "value": "only a question"}]},
        {"conversations": [{"from": "human", "value": "x y"}, {"from": "gpt", "value": "z"}]},
    ]
    f = tmp_path / "sg.json"
    f.write_text(json.dumps(data))
    reqs = build_requests("sharegpt", 5, dataset_path=f, output_len=None)
    assert len(reqs) == 5
    assert {r.prompt for r in reqs} == {"hello there", "x y"}
    assert {(r.prompt, r.output_len) for r in reqs} == {("hello there", 3), ("x y", 1)}


async def test_runner_never_exceeds_the_concurrency_cap() -> None:
    live = peak = 0

    async def send(req: BenchRequest, t0: float) -> RequestOutput:
        nonlocal live, peak
        live += 1
        peak = max(peak, live)
        await asyncio.sleep(0.01)
        live -= 1
        if req.prompt == "boom":
            raise RuntimeError("sender failed\nsecond line")
        return RequestOutput(True, 1, 1)

    reqs = [BenchRequest("p", 1, 1)] * 9 + [BenchRequest("boom", 1, 1)]
    res = await run_workload(reqs, send, max_concurrency=3)
    assert peak == 3
    assert len(res.outputs) == 10
    assert res.outputs[-1].error == "RuntimeError: sender failed"
    assert sum(o.success for o in res.outputs) == 9


def test_native_records_become_request_outputs() -> None:
    from servehall.bench.targets import output_from_record

    rec = {"start": 1.0, "prompt_tokens": 9, "arrivals": [(1.25, 1), (1.5, 2), (2.0, 1)]}
    out = output_from_record(rec)
    assert out.success and out.error == ""
    assert (out.prompt_tokens, out.output_tokens) == (9, 4)
    assert out.ttft == pytest.approx(0.25)
    assert out.itl == pytest.approx([0.25, 0.5])
    assert out.latency == pytest.approx(1.0)
    assert out.tpot == pytest.approx(0.75 / 3)
    assert out.token_times == [1.25, 1.5, 2.0]
    failed = output_from_record({"start": 0.0, "prompt_tokens": 3, "arrivals": [], "error": ""})
    assert not failed.success and failed.error == "the engine produced no token"
