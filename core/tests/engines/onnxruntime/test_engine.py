"""The ONNX Runtime GenAI engine (servehall.engines.onnxruntime.engine) beyond what the
conformance suite checks (test_conformance_cpu.py): the model facts it reads before and
after the build, the parameters it supports by batching mode, its start refusals
(onnxruntime-genai missing, the CUDA execution provider unavailable), stop token ids
matched by the engine (ONNX Runtime stops only on EOS), a prompt ONNX Runtime refuses,
slot statistics, and structured-output constraints it cannot apply. The tiny random Llama
is built once per session into ``ort_cache_dir``, shared with the conformance tests."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from servehall.config.models import ModelConfig
from servehall.engines.contract import SamplingParams, StructuredConstraint, TokenDelta
from servehall.engines.onnxruntime.engine import OnnxRuntimeEngine
from servehall.errors import ConfigError
from servehall.testing.conformance import collect, greedy, tokens_of

TIMEOUT = 60.0


def _genai_dir(tmp: Path, **model: Any) -> Path:
    d = tmp / "genai"
    d.mkdir(exist_ok=True)
    (d / "genai_config.json").write_text(json.dumps({"model": model}))
    return d


def _engine(
    path: Path, provider: Any = "cpu", max_model_len: int | None = None, **opts: Any
) -> OnnxRuntimeEngine:
    model = ModelConfig(
        name="tiny",
        path=path,
        backend=provider,
        max_model_len=max_model_len,
        options={"engine": "onnxruntime", **opts},
    )
    return OnnxRuntimeEngine(model, provider, provider)


# --- before start: facts, parameters, refusals (no onnxruntime needed) -------------------


def test_facts_of_an_onnx_genai_directory_and_the_context_cap(tmp_path: Path) -> None:
    d = _genai_dir(tmp_path, context_length=1024, eos_token_id=[2, 7], vocab_size=300)
    short = _engine(d, max_model_len=256, max_batch_size=4)
    info = short.model_info
    assert (info.max_model_len, info.eos_token_ids, info.vocab_size) == (256, (2, 7), 300)
    assert info.extra == {
        "engine": "onnxruntime",
        "provider": "cpu",
        "precision": "fp32",
        "max_batch_size": 4,
        "batching": "static",
        "kv_block_tokens": 256,
        "model_dir": None,  # known once started
    }
    assert _engine(d, max_model_len=4096).model_info.max_model_len == 1024  # the model's
    assert _engine(d).model_info.max_model_len == 1024
    (tmp_path / "bare").mkdir()
    bare = _genai_dir(tmp_path / "bare")  # no context length: 2048, no EOS, vocab unknown
    info = _engine(bare).model_info
    assert (info.max_model_len, info.eos_token_ids, info.vocab_size) == (2048, (), 0)


def test_facts_of_a_hugging_face_directory(tmp_path: Path) -> None:
    facts = {"max_position_embeddings": 640, "eos_token_id": 5, "vocab_size": 128}
    (tmp_path / "config.json").write_text(json.dumps(facts))
    info = _engine(tmp_path, max_model_len=100).model_info
    assert (info.max_model_len, info.eos_token_ids, info.vocab_size) == (100, (5,), 128)


def test_seed_is_supported_only_with_continuous_batching(tmp_path: Path) -> None:
    d = _genai_dir(tmp_path, context_length=512)
    cpu = _engine(d)
    assert cpu.supported_params == frozenset({"top_p", "top_k"})
    gpu = _engine(d, provider="cuda")  # fp16 with PagedAttention by default on CUDA
    assert gpu.supported_params == frozenset({"top_p", "top_k", "seed"})
    assert gpu.model_info.extra["batching"] == "continuous"
    static = _engine(d, provider="cuda", paged_attention=False)
    assert "seed" not in static.supported_params
    assert static.model_info.extra["batching"] == "static"


def test_construction_refuses_bad_paths_and_options(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="is not a directory"):
        _engine(tmp_path / "missing")
    with pytest.raises(ConfigError, match=r"models\.tiny\.options\.precision"):
        _engine(_genai_dir(tmp_path), precision="fp16")  # no fp16 on the CPU provider


def test_idle_stats_count_slots(tmp_path: Path) -> None:
    s = _engine(_genai_dir(tmp_path), max_batch_size=6).stats()
    assert (s.running, s.waiting, s.kv_cache_blocks_used, s.kv_cache_blocks_total) == (0, 0, 0, 6)


async def test_start_without_onnxruntime_genai_names_the_package(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "onnxruntime_genai", None)  # import raises ImportError
    engine = _engine(_genai_dir(tmp_path))
    with pytest.raises(ConfigError, match="needs the onnxruntime-genai package"):
        await engine.start()
    assert not (await engine.health()).ok


async def test_start_on_cuda_without_the_provider_says_why(tmp_path: Path) -> None:
    pytest.importorskip("onnxruntime_genai")
    from servehall.engines.onnxruntime.probe import cuda_provider_status

    status = cuda_provider_status()
    if status.available:
        pytest.skip("the CUDA execution provider runs here")
    engine = _engine(_genai_dir(tmp_path), provider="cuda")
    with pytest.raises(ConfigError, match="the CUDA execution provider cannot run here") as err:
        await engine.start()
    assert status.reason in str(err.value)


# --- a started engine on the tiny Llama --------------------------------------------------


@pytest.fixture
async def engine(
    servehall_tiny_llama: Path, ort_cache_dir: Path
) -> AsyncIterator[OnnxRuntimeEngine]:
    pytest.importorskip("onnxruntime_genai")
    eng = _engine(
        servehall_tiny_llama, max_model_len=256, max_batch_size=2, cache_dir=str(ort_cache_dir)
    )
    await asyncio.wait_for(eng.start(), 600)  # the session's first build: 10-30 s
    yield eng
    await eng.shutdown()


async def _run(
    engine: OnnxRuntimeEngine, rid: str, prompt: list[int], p: SamplingParams
) -> list[TokenDelta]:
    return await collect(engine.add_request(rid, prompt, p), TIMEOUT)


async def test_the_built_model_is_what_model_info_reports(engine: OnnxRuntimeEngine) -> None:
    from servehall.engines.onnxruntime import is_onnx_genai_dir

    info = engine.model_info
    model_dir = Path(str(info.extra["model_dir"]))
    assert is_onnx_genai_dir(model_dir)
    genai = json.loads((model_dir / "genai_config.json").read_text())["model"]
    assert info.vocab_size == genai["vocab_size"] == 512
    assert info.max_model_len == min(256, genai["context_length"])
    assert info.eos_token_ids == (2,)


async def test_stop_token_ids_end_the_turn_without_the_stop_token(
    engine: OnnxRuntimeEngine,
) -> None:
    prompt = [5, 17, 42, 99, 7]
    free = tokens_of(await _run(engine, "free", prompt, greedy(10)))
    assert len(free) == 10
    cut = next(i for i in range(1, 10) if free[i] not in free[:i])
    params = SamplingParams(
        max_tokens=10, temperature=0.0, ignore_eos=True, stop_token_ids=(free[cut],)
    )
    deltas = await _run(engine, "stopped", prompt, params)
    assert deltas[-1].finish_reason == "stop"
    assert tokens_of(deltas) == free[:cut]  # the stop token itself is not emitted
    again = await _run(engine, "after", prompt, greedy(10))  # the slot was given back
    assert tokens_of(again) == free
    assert engine.stats().kv_cache_blocks_used == 0


async def test_a_prompt_onnx_runtime_refuses_is_an_error_delta(engine: OnnxRuntimeEngine) -> None:
    too_long = [3 + i % 500 for i in range(2000)]  # longer than the model's context
    deltas = await _run(engine, "long", too_long, greedy(4))
    assert [d.finish_reason for d in deltas] == ["error"]
    assert deltas[0].error and deltas[0].token_ids == ()
    assert (await engine.health()).ok  # one request refused, the engine still serves
    assert len(tokens_of(await _run(engine, "next", [5, 6, 7], greedy(3)))) == 3


async def test_stats_count_requests_beyond_the_batch_as_waiting(
    engine: OnnxRuntimeEngine,
) -> None:
    streams = [engine.add_request(f"s{i}", [5, 6, 7 + i], greedy(150)) for i in range(3)]
    s = engine.stats()
    assert (s.running, s.waiting, s.kv_cache_blocks_used, s.kv_cache_blocks_total) == (2, 1, 2, 2)
    for i in range(3):
        await engine.abort(f"s{i}")
    for stream in streams:
        assert (await collect(stream, TIMEOUT))[-1].finish_reason == "abort"
    s = engine.stats()
    assert (s.running, s.waiting, s.kv_cache_blocks_used) == (0, 0, 0)


async def test_a_constraint_the_engine_cannot_apply_is_a_400_delta(
    engine: OnnxRuntimeEngine,
) -> None:
    if "structured_output" not in engine.supported_params:
        pytest.skip("this onnxruntime-genai build has no llguidance")
    params = SamplingParams(
        max_tokens=4, temperature=0.0, structured=StructuredConstraint(grammar='root ::= "a"')
    )
    deltas = await _run(engine, "ebnf", [5, 6, 7], params)
    assert [d.finish_reason for d in deltas] == ["error"]
    assert deltas[0].code == "invalid_request"
    assert "The constraint is not supported: " in str(deltas[0].error)
    assert "EBNF grammar is not supported" in str(deltas[0].error)
    assert (await engine.health()).ok and engine.stats().kv_cache_blocks_used == 0
