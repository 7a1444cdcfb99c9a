"""Tests of servehall.engines.contract: the engine contract's value types (defaults,
immutability, KV usage), the runtime-checkable protocols, and the embed-task check —
against a real engine (null) rather than a hand-made stand-in."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from servehall import ConfigError, ModelConfig
from servehall.engines.contract import (
    GRAMMAR_COMPILE_BUCKETS,
    EmbeddingEngine,
    Engine,
    EngineStats,
    ModelInfo,
    SamplingParams,
    StructuredConstraint,
    TokenDelta,
    check_embedding_engine,
)
from servehall.engines.null import NullEngine


def _null(tmp_path: Path) -> NullEngine:
    (tmp_path / "config.json").write_text(json.dumps({"vocab_size": 10, "eos_token_id": 2}))
    return NullEngine(ModelConfig(name="n", path=tmp_path, backend="null"))


def test_sampling_defaults() -> None:
    p = SamplingParams(16)
    assert (p.temperature, p.top_p, p.top_k, p.min_p, p.repetition_penalty) == (
        1.0,
        1.0,
        0,
        0.0,
        1.0,
    )
    assert p.seed is None and p.stop_token_ids == () and not p.ignore_eos and p.structured is None
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.max_tokens = 3  # type: ignore[misc]


def test_structured_constraint_is_hashable_and_defaults_to_bounded_whitespace() -> None:
    a = StructuredConstraint(json_schema="{}")
    assert a == StructuredConstraint(json_schema="{}") and hash(a) == hash(
        StructuredConstraint(json_schema="{}")
    )
    assert a.any_whitespace is False and a.regex is None and a.choice is None


def test_token_delta_defaults() -> None:
    d = TokenDelta((1, 2))
    assert d.finish_reason is None and d.error is None and d.code is None


@pytest.mark.parametrize(
    ("used", "total", "usage"), [(0, 0, 0.0), (5, 0, 0.0), (5, 10, 0.5), (12, 10, 1.0)]
)
def test_kv_cache_usage(used: int, total: int, usage: float) -> None:
    stats = EngineStats(
        running=0, waiting=0, kv_cache_blocks_used=used, kv_cache_blocks_total=total
    )
    assert stats.kv_cache_usage == usage


def test_grammar_buckets_are_increasing() -> None:
    assert list(GRAMMAR_COMPILE_BUCKETS) == sorted(set(GRAMMAR_COMPILE_BUCKETS))
    assert GRAMMAR_COMPILE_BUCKETS[0] > 0


def test_model_info_extra_is_per_instance() -> None:
    a, b = ModelInfo(8), ModelInfo(8)
    a.extra["device"] = "cpu"
    assert b.extra == {}


def test_real_engines_satisfy_the_protocols(tmp_path: Path) -> None:
    null = _null(tmp_path)
    assert isinstance(null, Engine)
    assert not isinstance(null, EmbeddingEngine)
    assert not isinstance(object(), Engine)


def test_embed_task_needs_an_embedding_engine(tmp_path: Path) -> None:
    null = _null(tmp_path)
    check_embedding_engine("n", "generate", null)  # any engine generates
    with pytest.raises(
        ConfigError, match=r"models\.n\.task: 'embed' needs an engine that can embed; NullEngine"
    ):
        check_embedding_engine("n", "embed", null)

    class Embedder:
        async def embed(self, inputs: list[list[int]]) -> list[list[float]]:
            return [[0.0] for _ in inputs]

    check_embedding_engine("e", "embed", Embedder())
