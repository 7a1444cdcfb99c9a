"""The built-in ``null`` backend: Engine conformance, pacing by step counts, batching
limit, options validation, and that ``auto`` never picks it."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from servehall.config.models import ModelConfig
from servehall.defaults.null_backend import probe_null
from servehall.engines.backends import BackendSpec
from servehall.engines.contract import SamplingParams, TokenDelta
from servehall.engines.null import NullEngine, null_engine_factory
from servehall.errors import ConfigError
from servehall.testing.conformance import BackendConformance, collect

EOS = 2


def _model_dir(tmp: Path) -> Path:
    d = tmp / "null-model"
    d.mkdir(exist_ok=True)
    cfg = {"vocab_size": 100, "max_position_embeddings": 512, "eos_token_id": EOS}
    (d / "config.json").write_text(json.dumps(cfg))
    return d


def _engine(tmp: Path, **options: object) -> NullEngine:
    return NullEngine(ModelConfig(name="n", path=_model_dir(tmp), backend="null", options=options))


class TestNullConformance(BackendConformance):
    timeout_s = 30.0

    @pytest.fixture
    def conformance_engine_factory(self, tmp_path: Path):  # type: ignore[no-untyped-def]
        return lambda: _engine(tmp_path, step_time_ms=1)

    @pytest.fixture
    def conformance_backend_spec(self) -> BackendSpec:
        return BackendSpec("null", probe_null, null_engine_factory, auto_priority=None)


async def _run(engine: NullEngine, rid: str, prompt: list[int], n: int) -> list[TokenDelta]:
    params = SamplingParams(max_tokens=n, temperature=0.0)
    return await collect(engine.add_request(rid, prompt, params), 30)


async def test_echoes_the_prompt_without_eos_to_max_tokens(tmp_path: Path) -> None:
    engine = _engine(tmp_path)
    await engine.start()
    try:
        deltas = await _run(engine, "a", [5, EOS, 6, 7], 7)
    finally:
        await engine.shutdown()
    assert [t for d in deltas for t in d.token_ids] == [5, 6, 7, 5, 6, 7, 5]
    assert deltas[-1].finish_reason == "length"
    assert all(len(d.token_ids) == 1 for d in deltas)  # one token per step by default


async def test_tokens_per_step_follow_rate_times_step_time(tmp_path: Path) -> None:
    # 200 tok/s x 10 ms = 2 tokens per sequence per step
    engine = _engine(tmp_path, tokens_per_s=200, step_time_ms=10)
    await engine.start()
    try:
        deltas = await _run(engine, "a", [9], 7)
        steps_fast = engine.steps
        assert [len(d.token_ids) for d in deltas] == [2, 2, 2, 1]
    finally:
        await engine.shutdown()
    # 50 tok/s x 10 ms = half a token per step: 6 tokens need 12 steps
    slow = _engine(tmp_path, tokens_per_s=50, step_time_ms=10)
    await slow.start()
    try:
        deltas = await _run(slow, "b", [9], 6)
    finally:
        await slow.shutdown()
    assert [len(d.token_ids) for d in deltas] == [1] * 6
    assert slow.steps == 12 and steps_fast == 4


async def test_max_num_seqs_makes_later_requests_wait(tmp_path: Path) -> None:
    engine = _engine(tmp_path, max_num_seqs=1, step_time_ms=2)
    await engine.start()
    finished: list[str] = []

    async def run(rid: str) -> None:
        await _run(engine, rid, [11, 12], 20)
        finished.append(rid)

    try:
        first = asyncio.create_task(run("first"))
        await asyncio.sleep(0)
        second = asyncio.create_task(run("second"))
        while engine.stats().running == 0:
            await asyncio.sleep(0.001)
        stats = engine.stats()
        assert (stats.running, stats.waiting) == (1, 1)
        await asyncio.gather(first, second)
    finally:
        await engine.shutdown()
    assert finished == ["first", "second"]


def test_options_are_validated_with_their_key(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        _engine(tmp_path, tokens_per_s=0)
    assert "models.n.options.tokens_per_s" in [k for k, _ in err.value.errors]
    with pytest.raises(ConfigError) as err:
        _engine(tmp_path, speed=3)
    assert "models.n.options.speed" in [k for k, _ in err.value.errors]
