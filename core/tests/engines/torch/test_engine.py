"""Unit tests of the shared torch engine beyond the conformance kit: options, KV sizing,
stop tokens, per-request sampling, lifecycle edges (tiny random Llama on CPU)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from servehall import ConfigError, ModelConfig, SamplingParams
from servehall.engines.torch import CpuDevice, TorchOptions
from servehall.testing.conformance import collect, tokens_of

torch = pytest.importorskip("torch")

from servehall.engines.torch.engine import TorchEngine  # noqa: E402

PROMPT = [5, 9, 14, 3, 27, 8]


def _engine(path: Path, **options: Any) -> TorchEngine:
    opts = {"kv_cache_blocks": 64, "block_size": 16, **options}
    max_len = opts.pop("max_model_len", 256)
    model = ModelConfig(name="tiny", path=path, backend="cpu", max_model_len=max_len, options=opts)
    return TorchEngine(model, CpuDevice(), "cpu")


@pytest.fixture
async def engine(servehall_tiny_llama: Path) -> Any:
    eng = _engine(servehall_tiny_llama)
    await eng.start()
    yield eng
    await eng.shutdown()


async def _run(eng: TorchEngine, rid: str, params: SamplingParams) -> tuple[list[int], str]:
    deltas = await collect(eng.add_request(rid, PROMPT, params), 60)
    return tokens_of(deltas), str(deltas[-1].finish_reason)


# --- options ---------------------------------------------------------------------------


def test_cpu_device_rejects_fp16_and_flash_attention(servehall_tiny_llama: Path) -> None:
    with pytest.raises(ConfigError, match="float16"):
        CpuDevice().resolve_dtype(TorchOptions(dtype="fp16"))
    with pytest.raises(ConfigError, match="not available on cpu"):
        _engine(servehall_tiny_llama, attn_implementation="flash_attention_2")


def test_missing_config_json_is_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"config\.json"):
        _engine(tmp_path)


# --- KV sizing -------------------------------------------------------------------------


async def test_explicit_max_model_len_larger_than_kv_cache_fails(
    servehall_tiny_llama: Path,
) -> None:
    eng = _engine(servehall_tiny_llama, kv_cache_blocks=8, max_model_len=500)
    with pytest.raises(ConfigError, match="less than max_model_len"):
        await eng.start()
    await eng.shutdown()


async def test_default_kv_sizing_from_free_memory_caps_native_length(
    servehall_tiny_llama: Path,
) -> None:
    model = ModelConfig(name="t", path=servehall_tiny_llama, backend="cpu", options={})
    eng = TorchEngine(model, CpuDevice(), "cpu")
    assert eng.model_info.max_model_len == 512  # config.json max_position_embeddings
    await eng.start()
    try:
        stats = eng.stats()
        assert 0 < stats.kv_cache_blocks_total <= CpuDevice.max_default_kv_blocks  # type: ignore[operator]
        assert stats.device_memory_used_bytes and stats.device_memory_total_bytes
        assert eng.model_info.extra["kv_cache_blocks"] == stats.kv_cache_blocks_total
    finally:
        await eng.shutdown()


# --- requests --------------------------------------------------------------------------


async def test_model_info_and_requests_before_start(servehall_tiny_llama: Path) -> None:
    eng = _engine(servehall_tiny_llama)
    assert eng.model_info.eos_token_ids == (2,) and eng.model_info.vocab_size == 512
    deltas = await collect(eng.add_request("x", PROMPT, SamplingParams(max_tokens=2)), 5)
    assert [d.finish_reason for d in deltas] == ["error"] and deltas[0].error
    assert not (await eng.health()).ok
    with pytest.raises(ValueError):
        eng.add_request("y", [], SamplingParams(max_tokens=2))


async def test_stop_token_ends_with_stop_and_is_not_emitted(engine: TorchEngine) -> None:
    ref, reason = await _run(engine, "ref", SamplingParams(12, temperature=0, ignore_eos=True))
    assert reason == "length" and len(ref) == 12
    stop = ref[4]
    cut = ref.index(stop)
    got, reason = await _run(
        engine, "stop", SamplingParams(12, temperature=0, ignore_eos=True, stop_token_ids=(stop,))
    )
    assert reason == "stop" and got == ref[:cut]


async def test_seeded_sampling_is_reproducible_and_seed_dependent(engine: TorchEngine) -> None:
    def p(seed: int) -> SamplingParams:
        return SamplingParams(16, temperature=1.5, seed=seed, ignore_eos=True)

    a1, _ = await _run(engine, "s1", p(1))
    a2, _ = await _run(engine, "s2", p(1))
    assert a1 == a2
    others = [(await _run(engine, f"s-{seed}", p(seed)))[0] for seed in (2, 3, 4)]
    assert any(o != a1 for o in others), "different seeds never changed the sample"
    # concurrently sampled requests keep their own generators
    together = await asyncio.gather(*(_run(engine, f"c-{i}", p(1)) for i in range(3)))
    assert all(t[0] == a1 for t in together)


async def test_tiny_top_p_equals_greedy(engine: TorchEngine) -> None:
    greedy, _ = await _run(engine, "g", SamplingParams(10, temperature=0, ignore_eos=True))
    nucleus, _ = await _run(
        engine, "n", SamplingParams(10, temperature=0.8, top_p=1e-6, seed=5, ignore_eos=True)
    )
    assert nucleus == greedy


async def test_top_k_1_and_min_p_1_equal_greedy(engine: TorchEngine) -> None:
    greedy, _ = await _run(engine, "g", SamplingParams(10, temperature=0, ignore_eos=True))

    def hot(seed: int, **kw: Any) -> SamplingParams:
        return SamplingParams(10, temperature=2.0, seed=seed, ignore_eos=True, **kw)

    top1, _ = await _run(engine, "k", hot(1, top_k=1))
    minp, _ = await _run(engine, "p", hot(2, min_p=1.0))
    free = {tuple((await _run(engine, f"f{i}", hot(i)))[0]) for i in range(3)}
    assert top1 == greedy and minp == greedy
    assert free != {tuple(greedy)}  # without the filters, temperature 2 does sample


async def test_repetition_penalty_changes_greedy_output(engine: TorchEngine) -> None:
    greedy, _ = await _run(engine, "g", SamplingParams(24, temperature=0, ignore_eos=True))
    rep, _ = await _run(
        engine, "r", SamplingParams(24, temperature=0, ignore_eos=True, repetition_penalty=5.0)
    )
    assert rep != greedy


async def test_abort_after_finish_and_shutdown_aborts_live_streams(engine: TorchEngine) -> None:
    tokens, reason = await _run(engine, "done", SamplingParams(3, temperature=0, ignore_eos=True))
    assert len(tokens) == 3 and reason == "length"
    await engine.abort("done")  # finished: no-op
    stream = engine.add_request("live", PROMPT, SamplingParams(400, temperature=0, ignore_eos=True))
    first = await asyncio.wait_for(anext(stream), 30)
    assert first.token_ids
    await engine.shutdown()
    rest = await collect(stream, 30)
    assert rest[-1].finish_reason == "abort"
    assert not (await engine.health()).ok


async def test_kv_pressure_queues_requests_instead_of_preempting(
    servehall_tiny_llama: Path,
) -> None:
    """More requests than the KV cache holds: the excess waits (stats.waiting) and every
    request still gets its full, unchanged greedy output (no preemption). A waiting
    request can be aborted before it ever runs; a request larger than the cache fails."""
    eng = _engine(servehall_tiny_llama, kv_cache_blocks=5, max_model_len=64)
    await eng.start()
    try:
        params = SamplingParams(22, temperature=0, ignore_eos=True)  # 10 + 22 = 2 blocks

        def prompt(i: int) -> list[int]:
            return [5 + i] * 10

        alone = [
            tokens_of(await collect(eng.add_request(f"a{i}", prompt(i), params), 60))
            for i in range(5)
        ]
        streams = [eng.add_request(f"p{i}", prompt(i), params) for i in range(5)]
        victim = eng.add_request("victim", prompt(0), params)
        stats = eng.stats()
        assert stats.waiting >= 3 and stats.kv_cache_blocks_used <= 5
        await eng.abort("victim")
        assert [d.finish_reason for d in await collect(victim, 5)] == ["abort"]
        results = await asyncio.gather(*(collect(s, 120) for s in streams))
        assert [tokens_of(r) for r in results] == alone
        assert all(r[-1].finish_reason == "length" for r in results)
        huge = await collect(eng.add_request("huge", [7] * 60, SamplingParams(40)), 5)
        assert huge[-1].finish_reason == "error" and "KV-cache blocks" in str(huge[-1].error)
        final = eng.stats()
        assert final.waiting == 0 and final.running == 0 and final.kv_cache_blocks_used == 0
    finally:
        await eng.shutdown()


async def test_health_reports_a_stalled_step_loop_and_recovers(servehall_tiny_llama: Path) -> None:
    eng = _engine(servehall_tiny_llama)
    eng.stall_timeout_s = 0.3
    await eng.start()
    try:
        original = eng._model.forward

        def slow_forward(*args: Any, **kwargs: Any) -> Any:
            import time

            time.sleep(3.0)  # a hung kernel, briefly
            return original(*args, **kwargs)

        eng._model.forward = slow_forward
        stream = eng.add_request("slow", PROMPT, SamplingParams(1, temperature=0, ignore_eos=True))
        deadline = time.monotonic() + 2.5  # inside the 3 s step, past the 0.3 s timeout
        health = await eng.health()
        while health.ok and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
            health = await eng.health()
        assert not health.ok and "stalled" in health.reason
        eng._model.forward = original
        deltas = await collect(stream, 30)
        assert deltas[-1].finish_reason == "length"
        assert (await eng.health()).ok
    finally:
        await eng.shutdown()
