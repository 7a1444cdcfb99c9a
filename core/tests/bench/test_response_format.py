"""``--response-format`` / ``rf=`` of ``servehall bench`` (parsing and the request body)."""

from __future__ import annotations

import jsonschema
import pytest

from servehall.bench.client import ClientOptions, request_body
from servehall.bench.compare import grammar_delta, parse_target
from servehall.bench.workload import BENCH_SCHEMA, BenchRequest, response_format_body


def test_targets_take_rf() -> None:
    t = parse_target("serve:http://127.0.0.1:1,h1,rf=json")
    assert (t.url, t.http2, t.response_format) == ("http://127.0.0.1:1", False, "json")
    assert parse_target("launch:h2,rf=none").response_format == "none"
    assert parse_target("launch:h2").response_format is None
    with pytest.raises(ValueError, match="rf=none or rf=json"):
        parse_target("launch:h2,rf=xml")


def test_constrained_body_drops_ignore_eos() -> None:
    rf = response_format_body("json")
    assert rf is not None
    jsonschema.Draft202012Validator.check_schema(BENCH_SCHEMA)
    opts = ClientOptions("http://x", "m", response_format=rf)
    body = request_body(opts, BenchRequest("hi", 2, 8))
    assert body["response_format"] == rf and "ignore_eos" not in body
    assert "ignore_eos" in request_body(ClientOptions("http://x", "m"), BenchRequest("hi", 2, 8))
    assert response_format_body("none") is None


def test_grammar_delta_quantiles() -> None:
    before = {"hits": 1.0, "misses": 1.0, "sum": 0.01, "buckets": {"0.01": 1.0, "0.1": 1.0}}
    after = {"hits": 99.0, "misses": 3.0, "sum": 0.1, "buckets": {"0.01": 2.0, "0.1": 3.0}}
    d = grammar_delta(before, after)
    assert d["compiles"] == 2 and d["cache_hits"] == 98
    assert d["cache_hit_rate"] == pytest.approx(0.98)
    assert d["compile_p50_s"] == 0.01 and d["compile_p99_s"] == 0.1
