"""``servehall.engines.embedbatch``: the embedding engines' shared queue (calls that
arrive during a pass share the next), pass splitting, the refusal stream, and the
engines' shared base (through a real subclass whose "model" sums its inputs)."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from servehall.config.models import ModelConfig
from servehall.engines.contract import SamplingParams
from servehall.engines.embedbatch import (
    EmbedBatcher,
    EmbeddingEngineBase,
    padded_passes,
    refuse_generation,
)
from servehall.engines.kit import HfModelFacts
from servehall.errors import ConfigError, EngineError, EngineUnavailableError

log = logging.getLogger("test.embedbatch")


def test_padded_passes_respect_the_budget() -> None:
    assert padded_passes([], 8) == []
    assert padded_passes([[1], [1, 2], [1, 2, 3]], 100) == [(0, 3, 3)]
    # 2 x 3 = 6 fits 6; adding a third input (3 x 3 = 9) does not
    assert padded_passes([[1, 2, 3], [1], [1]], 6) == [(0, 2, 3), (2, 3, 1)]
    # an input longer than the budget is a pass of its own
    assert padded_passes([[1] * 10, [1]], 4) == [(0, 1, 10), (1, 2, 1)]


async def test_calls_during_a_pass_share_the_next() -> None:
    gate = threading.Event()
    passes: list[list[list[int]]] = []

    def forward(inputs: list[list[int]]) -> list[list[float]]:
        passes.append(inputs)
        if len(passes) == 1:
            gate.wait(10)
        return [[float(sum(x))] for x in inputs]

    with ThreadPoolExecutor(1) as pool:
        b = EmbedBatcher("m", pool, forward, log)
        first = asyncio.ensure_future(b.embed([[1, 2]]))
        while not passes:
            await asyncio.sleep(0.01)
        assert b.running == 1
        second = asyncio.ensure_future(b.embed([[3], [4, 5]]))
        third = asyncio.ensure_future(b.embed([[6]]))
        await asyncio.sleep(0.05)
        assert b.waiting == 2
        gate.set()
        assert await first == [[3.0]]
        assert await second == [[3.0], [9.0]] and await third == [[6.0]]
        assert passes == [[[1, 2]], [[3], [4, 5], [6]]]
        assert (b.running, b.waiting) == (0, 0)
        assert await b.embed([]) == []
        await b.close()
        with pytest.raises(EngineUnavailableError):
            await b.embed([[1]])


async def test_a_failed_pass_fails_its_calls_only() -> None:
    def forward(inputs: list[list[int]]) -> list[list[float]]:
        if inputs == [[0]]:
            raise RuntimeError("boom")
        return [[1.0] for _ in inputs]

    with ThreadPoolExecutor(1) as pool:
        b = EmbedBatcher("m", pool, forward, log)
        with pytest.raises(EngineError, match="RuntimeError: boom"):
            await b.embed([[0]])
        assert await b.embed([[1]]) == [[1.0]]
        await b.close()


async def test_close_fails_queued_calls() -> None:
    gate = threading.Event()

    def forward(inputs: list[list[int]]) -> list[list[float]]:
        gate.wait(10)
        return [[1.0] for _ in inputs]

    with ThreadPoolExecutor(1) as pool:
        b = EmbedBatcher("m", pool, forward, log)
        running = asyncio.ensure_future(b.embed([[1]]))
        await asyncio.sleep(0.05)
        queued = asyncio.ensure_future(b.embed([[2]]))
        await asyncio.sleep(0)
        closing = asyncio.ensure_future(b.close())
        await asyncio.sleep(0.05)
        gate.set()
        await closing
        assert await running == [[1.0]]  # the pass in flight finishes
        with pytest.raises(EngineUnavailableError):
            await queued


async def test_refuse_generation() -> None:
    stream = refuse_generation("mini", "r1")
    deltas = [d async for d in stream]
    assert len(deltas) == 1 and deltas[0].finish_reason == "error"
    assert deltas[0].code == "invalid_request" and "'mini'" in (deltas[0].error or "")


# --- EmbeddingEngineBase ----------------------------------------------------------------


class SumEngine(EmbeddingEngineBase):
    """A real subclass of the base: its "model" is a vector of (sum, length) per input,
    split into passes of ``batch_tokens`` padded tokens; ``load_error`` makes the load
    raise it."""

    backend = "sum"
    batch_tokens = 8

    def __init__(self, path: Path, load_error: Exception | None = None) -> None:
        facts = HfModelFacts.read(path)
        super().__init__(ModelConfig(name="m", path=path), path, facts, log, "sum: load failed")
        self.load_error = load_error
        self.passes: list[tuple[int, int]] = []
        self.unloaded = False

    def _new_executor(self) -> ThreadPoolExecutor:
        return ThreadPoolExecutor(1, thread_name_prefix="sum-engine")

    def _load(self) -> None:
        if self.load_error is not None:
            raise self.load_error

    def _forward(self, inputs: list[list[int]], longest: int) -> list[list[float]]:
        self.passes.append((len(inputs), longest))
        return [[float(sum(x)), float(len(x))] for x in inputs]

    def _unload(self) -> None:
        self.unloaded = True


def _model_dir(tmp_path: Path, **config: object) -> Path:
    (tmp_path / "config.json").write_text(json.dumps(config))
    return tmp_path


async def test_engine_base_lifecycle_passes_and_refusals(tmp_path: Path) -> None:
    """Facts from config.json (dim = hidden_size, the input limit capped by
    max_seq_length), not running before start / after shutdown, passes within
    ``batch_tokens``, the generation refusal, and an idempotent shutdown that unloads."""
    d = _model_dir(tmp_path, hidden_size=2, max_position_embeddings=512, vocab_size=9)
    (d / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 16}))
    engine = SumEngine(d)
    assert (engine._dim, engine._max_model_len, engine._vocab_size) == (2, 16, 9)
    assert (await engine.health()).reason == "engine is not started"
    with pytest.raises(EngineUnavailableError):
        await engine.embed([[1]])
    await engine.start()
    await engine.start()  # idempotent
    assert (await engine.health()).ok
    # 2 inputs x 3 tokens fit 8 padded tokens; the third input starts a second pass
    assert await engine.embed([[1, 2, 3], [4], [5, 6]]) == [[6.0, 3.0], [4.0, 1.0], [11.0, 2.0]]
    assert engine.passes == [(2, 3), (1, 2)]
    assert await engine.embed([]) == []
    stats = engine.stats()
    assert (stats.running, stats.waiting, stats.kv_cache_blocks_total) == (0, 0, 1)
    deltas = [d async for d in engine.add_request("g", [1], SamplingParams(max_tokens=1))]
    assert deltas[0].finish_reason == "error" and deltas[0].code == "invalid_request"
    await engine.abort("g")
    await engine.shutdown()
    await engine.shutdown()
    assert engine.unloaded and (await engine.health()).reason == "engine is shut down"
    with pytest.raises(EngineUnavailableError):
        await engine.embed([[1]])


async def test_engine_base_load_failures(tmp_path: Path) -> None:
    """A ConfigError from the load passes as it is; any other exception is an EngineError
    with the engine's ``load_failure`` prefix, its type and message; the executor is shut
    down."""
    d = _model_dir(tmp_path, hidden_size=2)
    with pytest.raises(ConfigError, match="bad option"):
        await SumEngine(d, ConfigError("bad option")).start()
    engine = SumEngine(d, OSError("no weights"))
    with pytest.raises(EngineError, match=r"^sum: load failed: OSError: no weights$"):
        await engine.start()
    assert engine._executor is None  # its thread is let go
    assert not (await engine.health()).ok


def test_engine_base_refuses_a_dense_projection(tmp_path: Path) -> None:
    """A sentence-transformers ``Dense`` module is a config error naming the path."""
    d = _model_dir(tmp_path, hidden_size=2)
    modules = [
        {"path": "", "type": "sentence_transformers.models.Transformer"},
        {"path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"path": "2_Dense", "type": "sentence_transformers.models.Dense"},
    ]
    (d / "modules.json").write_text(json.dumps(modules))
    for sub, cfg in (("1_Pooling", {"pooling_mode": "cls"}), ("2_Dense", {"out_features": 5})):
        (d / sub).mkdir()
        (d / sub / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConfigError, match=r"models\.m\.path: .*5-dimensional.*sum embedding"):
        SumEngine(d)
