"""Tests of servehall.bench.workload: random and ShareGPT requests (with and without a
real tokenizer, built locally), their error paths, seeded arrival offsets, the spec's
description, and the ``--response-format`` bodies."""

from __future__ import annotations

import itertools
import json
import math
import statistics
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parents[1]))
from text_fixtures import build_tokenizer

from servehall.bench.workload import (
    BENCH_SCHEMA,
    BenchRequest,
    WorkloadError,
    WorkloadSpec,
    arrival_offsets,
    build_requests,
    random_requests,
    response_format_body,
    sharegpt_requests,
)


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from servehall.text.tokenizer import load_tokenizer

    return load_tokenizer(build_tokenizer(tmp_path_factory.mktemp("tok")))


def test_random_requests_without_a_tokenizer_count_words() -> None:
    reqs = random_requests(5, 10, 7, seed=3)
    assert [(r.prompt_len, r.output_len) for r in reqs] == [(10, 7)] * 5
    assert all(len(r.prompt.split()) == 10 for r in reqs)
    assert reqs == random_requests(5, 10, 7, seed=3)  # seeded
    assert reqs != random_requests(5, 10, 7, seed=4)


def test_random_lengths_stay_in_the_range() -> None:
    reqs = random_requests(200, 100, 20, range_ratio=0.5, seed=1)
    assert all(50 <= r.prompt_len <= 150 and 10 <= r.output_len <= 30 for r in reqs)
    assert len({r.prompt_len for r in reqs}) > 20  # drawn, not fixed
    assert all(r.output_len >= 1 for r in random_requests(50, 1, 1, range_ratio=0.9))


def test_random_prompts_are_cut_with_the_tokenizer(tokenizer: Any) -> None:
    for r in random_requests(10, 12, 4, tokenizer=tokenizer, seed=2):
        assert r.prompt_len == len(tokenizer.encode_plain(r.prompt))
        assert abs(r.prompt_len - 12) <= 1  # decode/encode may merge at the cut


@pytest.mark.parametrize(
    ("args", "kwargs", "message"),
    [
        ((0, 1, 1), {}, "--num-requests must be at least 1 (got 0)"),
        ((1, 0, 1), {}, "--input-len must be at least 1 (got 0)"),
        ((1, 1, 0), {}, "--output-len must be at least 1 (got 0)"),
        ((1, 1, 1), {"range_ratio": 1.0}, "--range-ratio must be in [0, 1) (got 1.0)"),
        ((1, 1, 1), {"range_ratio": -0.1}, "--range-ratio must be in [0, 1)"),
    ],
)
def test_random_request_errors(args: tuple[int, int, int], kwargs: Any, message: str) -> None:
    with pytest.raises(WorkloadError) as exc:
        random_requests(*args, **kwargs)
    assert message in str(exc.value)


def _sharegpt(path: Path, data: Any) -> Path:
    path.write_text(json.dumps(data))
    return path


def _conv(prompt: Any, reply: Any) -> dict[str, Any]:
    return {"conversations": [{"from": "human", "value": prompt}, {"from": "gpt", "value": reply}]}


def test_sharegpt_uses_first_turns_and_skips_unusable_ones(tmp_path: Path) -> None:
    path = _sharegpt(
        tmp_path / "s.json",
        [
            _conv("one two three", "a b"),
            {"conversations": [{"from": "human", "value": "alone"}]},  # no reply
            _conv("", "empty prompt"),
            _conv(5, "not text"),
            "not a dict",
            {"conversations": ["x", "y"]},
            _conv("four five", "c d e f g h i j k l"),
        ],
    )
    reqs = sharegpt_requests(path, 2, seed=0)
    assert sorted((r.prompt, r.prompt_len, r.output_len) for r in reqs) == [
        ("four five", 2, 10),
        ("one two three", 3, 2),
    ]
    # output_len overrides the reply's length; max_len skips pairs over it
    assert {r.output_len for r in sharegpt_requests(path, 2, output_len=4)} == {4}
    assert [r.prompt for r in sharegpt_requests(path, 1, max_len=6)] == ["one two three"]
    # fewer usable conversations than requests: the file is cycled
    cycled = sharegpt_requests(path, 5, max_len=6)
    assert [r.prompt for r in cycled] == ["one two three"] * 5


def test_sharegpt_counts_with_the_tokenizer(tmp_path: Path, tokenizer: Any) -> None:
    path = _sharegpt(tmp_path / "s.json", [_conv("the quick brown fox", "jumps over")])
    (r,) = sharegpt_requests(path, 1, tokenizer=tokenizer)
    assert r.prompt_len == len(tokenizer.encode_plain("the quick brown fox"))
    assert r.output_len == len(tokenizer.encode_plain("jumps over"))


def test_sharegpt_file_errors(tmp_path: Path) -> None:
    cases = [
        (tmp_path / "none.json", "does not exist"),
        (tmp_path / "bad.json", "cannot read dataset file"),
        (_sharegpt(tmp_path / "obj.json", {"a": 1}), "holds a JSON list"),
        (_sharegpt(tmp_path / "empty.json", [_conv("", "")]), "no usable ShareGPT"),
    ]
    (tmp_path / "bad.json").write_text("[{nope")
    for path, message in cases:
        with pytest.raises(WorkloadError, match=message):
            sharegpt_requests(path, 1)
    ok = _sharegpt(tmp_path / "ok.json", [_conv("a b c", "d")])
    with pytest.raises(WorkloadError, match="no usable"):
        sharegpt_requests(ok, 1, max_len=3)  # every pair over max_len


def test_build_requests_dispatches_and_checks_the_dataset(tmp_path: Path) -> None:
    (r,) = build_requests("random", 1, input_len=3, output_len=None)
    assert (r.prompt_len, r.output_len) == (3, 128)  # unset output_len: 128
    path = _sharegpt(tmp_path / "s.json", [_conv("x y", "z")])
    got = build_requests("sharegpt", 1, dataset_path=path, output_len=None)
    assert got == [BenchRequest("x y", 2, 1)]  # the reply's length
    assert build_requests("sharegpt", 1, dataset_path=path)[0].output_len == 128
    with pytest.raises(WorkloadError, match="needs --dataset-path"):
        build_requests("sharegpt", 1)
    with pytest.raises(WorkloadError, match="unknown dataset 'sonnet'; known: random, sharegpt"):
        build_requests("sonnet", 1)


def test_arrival_offsets() -> None:
    assert arrival_offsets(3, math.inf) == [0.0, 0.0, 0.0]
    offs = arrival_offsets(2000, 50.0, seed=1)
    assert offs[0] == 0.0 and offs == sorted(offs)
    assert offs == arrival_offsets(2000, 50.0, seed=1)
    gaps = [b - a for a, b in itertools.pairwise(offs)]
    assert statistics.mean(gaps) == pytest.approx(1 / 50, rel=0.1)
    # burstiness < 1: burstier (a larger spread of gaps) at the same mean rate
    bursty = arrival_offsets(2000, 50.0, burstiness=0.25, seed=1)
    bgaps = [b - a for a, b in itertools.pairwise(bursty)]
    assert statistics.mean(bgaps) == pytest.approx(1 / 50, rel=0.2)
    assert statistics.stdev(bgaps) > 1.5 * statistics.stdev(gaps)
    bad = [(0, 1, "--request-rate"), (-1, 1, "--request-rate"), (math.nan, 1, "--request-rate")]
    for rate, burst, message in [*bad, (1, 0, "--burstiness")]:
        with pytest.raises(WorkloadError, match=message):
            arrival_offsets(2, rate, burstiness=burst)


def _spec(**kw: Any) -> WorkloadSpec:
    base: dict[str, Any] = {
        "num_requests": 4, "concurrency": 2, "request_rate": math.inf, "burstiness": 1.0,
        "dataset": "random", "dataset_path": None, "input_len": 5, "output_len": 3,
        "range_ratio": 0.0, "seed": 0, "endpoint": "chat", "ignore_eos": True,
        "slo": {"ttft": 100.0},
    }  # fmt: skip
    return WorkloadSpec(**{**base, **kw})


def test_spec_requests_offsets_and_description(tmp_path: Path) -> None:
    spec = _spec()
    assert [(r.prompt_len, r.output_len) for r in spec.requests(None)] == [(5, 3)] * 4
    assert spec.offsets() is None
    d = spec.describe()
    assert (
        d["request_rate"] is None and d["dataset_path"] is None and d["slo_ms"] == {"ttft": 100.0}
    )
    assert d["response_format"] == "none" and d["endpoint"] == "chat"
    json.dumps(d)  # a report field: JSON as it is
    timed = _spec(request_rate=10.0, dataset_path=tmp_path / "s.json")
    assert timed.offsets() == arrival_offsets(4, 10.0, seed=0)
    assert timed.describe()["request_rate"] == 10.0
    assert timed.describe()["dataset_path"] == str(tmp_path / "s.json")


def test_response_format_bodies() -> None:
    assert response_format_body("none") is None
    body = response_format_body("json")
    assert body == {
        "type": "json_schema",
        "json_schema": {"name": "order", "schema": BENCH_SCHEMA, "strict": True},
    }
    with pytest.raises(ValueError, match="unknown response format 'xml'"):
        response_format_body("xml")
