"""servehall.engines.vllm.stats: vLLM's statistics as ``EngineStats``, mostly without
vLLM (it lives in .venv-vllm; the real engine's figures are checked end to end in
tests/test_vllm_e2e.py): a fake ``SchedulerStats`` object per step → ``EngineStats``
(prefix-cache totals, KV usage), device-memory rows on CUDA (a fake reader) and none on
the CPU build, and the rows' way through the worker's heartbeat to
``servehall_device_memory_*{device}``; vLLM's own speculative-decoding stats objects
under ``.venv-vllm``."""

from __future__ import annotations

from types import SimpleNamespace

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import Metric

from servehall.engines.contract import EngineStats
from servehall.engines.vllm.stats import (
    DeviceMemory,
    VllmStats,
    engine_stats,
    record_scheduler_stats,
)
from servehall.metrics_scrape import _EngineOpsFamilies
from servehall.worker.messages import Heartbeat, report_decoder, report_encoder


def fake_step(queries: int | None, hits: int = 0, usage: float = 0.25) -> SimpleNamespace:
    """What vLLM's ``SchedulerStats`` offers the stat logger after one step."""
    pc = None if queries is None else SimpleNamespace(queries=queries, hits=hits)
    return SimpleNamespace(
        num_running_reqs=2, num_waiting_reqs=1, kv_cache_usage=usage, prefix_cache_stats=pc
    )


def test_fake_vllm_stats_prefix_cache_totals_and_kv_usage() -> None:
    stats = VllmStats()
    stats.kv_blocks_total = 200
    record_scheduler_stats(stats, fake_step(100, 40))
    record_scheduler_stats(stats, fake_step(60, 60, usage=0.5))
    s = engine_stats(stats)
    assert (s.running, s.waiting) == (2, 1)
    assert (s.kv_cache_blocks_used, s.kv_cache_blocks_total) == (100, 200)
    assert (s.prefix_cache_queries, s.prefix_cache_hits) == (160, 100)  # per step, summed
    assert s.devices == () and s.device_memory_total_bytes is None


def test_fake_vllm_stats_without_prefix_caching_report_no_prefix_figures() -> None:
    stats = VllmStats()
    record_scheduler_stats(stats, fake_step(None))
    s = engine_stats(stats)
    assert s.prefix_cache_queries is None and s.prefix_cache_hits is None


def test_device_memory_rows_on_cuda_are_read_at_most_once_a_second_and_none_on_cpu() -> None:
    calls: list[int] = []

    def read(count: int) -> tuple[tuple[str, int, int], ...]:
        calls.append(count)
        return tuple((f"cuda:{i}", 10 + i, 100) for i in range(count))

    gpu = DeviceMemory("cuda", 2, every_s=60.0, read=read)
    assert gpu.get() == (("cuda:0", 10, 100), ("cuda:1", 11, 100))
    assert gpu.get() == (("cuda:0", 10, 100), ("cuda:1", 11, 100))
    assert calls == [2]
    cpu = DeviceMemory("cpu", 1, read=read)
    assert cpu.get() == () and calls == [2]  # the CPU build reports nothing


def test_device_rows_cross_the_heartbeat_and_become_one_series_per_device() -> None:
    devices = (("cuda:0", 30, 80), ("cuda:1", 20, 80))
    beat = Heartbeat(1, 0, 5, 10, None, None, True, "", 7, 3, None, devices)
    back = report_decoder.decode(report_encoder.encode(beat))
    assert isinstance(back, Heartbeat) and back.devices == devices
    old = report_decoder.decode(report_encoder.encode(Heartbeat(1, 0, 5, 10, None, None, True, "")))
    assert isinstance(old, Heartbeat) and old.devices == ()

    ops = _EngineOpsFamilies()
    ops.add_stats(["demo", ""], object(), EngineStats(1, 0, 5, 10, devices=back.devices))
    registry = CollectorRegistry()

    class Collector:
        def collect(self) -> list[Metric]:
            return ops.families()

    registry.register(Collector())
    text = generate_latest(registry).decode()
    for device, used, total in devices:
        labels = f'device="{device}",model="demo",version=""'
        assert f"servehall_device_memory_used_bytes{{{labels}}} {float(used)}" in text, text
        assert f"servehall_device_memory_total_bytes{{{labels}}} {float(total)}" in text


def _exposition(families: list[Metric]) -> str:
    """The text exposition of ``families`` as ``GET /metrics`` writes it."""
    registry = CollectorRegistry()

    class Collector:
        def collect(self) -> list[Metric]:
            return families

    registry.register(Collector())
    return generate_latest(registry).decode()


_REAL_SPEC_STEPS = r"""
import json, sys
from vllm.v1.metrics.stats import SchedulerStats
from vllm.v1.spec_decode.metrics import SpecDecodingStats
from servehall.engines.vllm.stats import VllmStats, engine_stats, record_scheduler_stats

stats = VllmStats()
steps = [[(3, 3), (3, 1)], [(3, 0)], None, [(2, 2), (3, 2)]]  # (draft, accepted) per request
for step in steps:
    sd = None
    if step is not None:
        sd = SpecDecodingStats.new(3)
        for drafted, accepted in step:
            sd.observe_draft(num_draft_tokens=drafted, num_accepted_tokens=accepted)
    record_scheduler_stats(stats, SchedulerStats(spec_decoding_stats=sd))
s = engine_stats(stats).spec_decode
json.dump([s.drafts, s.draft_tokens, s.accepted_tokens, list(s.accepted_per_position)], sys.stdout)
"""


def test_vllm_spec_decoding_stats_become_spec_decode_counters_and_metrics() -> None:
    """vLLM's own ``SchedulerStats``/``SpecDecodingStats`` objects (built with its
    ``observe_draft``, under ``.venv-vllm``) summed over steps into ``EngineStats
    .spec_decode``, then through the heartbeat to the ``servehall_spec_decode_*`` series."""
    from servehall.engines.contract import SpecDecodeStats
    from servehall.testing.vllm_env import run_in_vllm_env

    drafts, draft_tokens, accepted, per_pos = run_in_vllm_env(_REAL_SPEC_STEPS)
    # 5 drafts of 3+3+3+2+3 tokens; accepted 3+1+0+2+2, by position: 1st 4, 2nd 3, 3rd 1
    assert (drafts, draft_tokens, accepted, per_pos) == (5, 14, 8, [4, 3, 1])
    sd = SpecDecodeStats(drafts, draft_tokens, accepted, tuple(per_pos))
    beat = Heartbeat(0, 0, 0, 1, None, None, True, "", spec_decode=(5, 14, 8, (4, 3, 1)))
    back = report_decoder.decode(report_encoder.encode(beat))
    assert isinstance(back, Heartbeat) and SpecDecodeStats(*back.spec_decode) == sd  # type: ignore[misc]
    ops = _EngineOpsFamilies()
    ops.add_stats(["m", ""], object(), EngineStats(0, 0, 0, 1, spec_decode=sd))
    text = _exposition(ops.families())
    assert 'servehall_spec_decode_num_drafts_total{model="m",version=""} 5.0' in text
    assert 'servehall_spec_decode_num_draft_tokens_total{model="m",version=""} 14.0' in text
    assert 'servehall_spec_decode_num_accepted_tokens_total{model="m",version=""} 8.0' in text
    pos = "servehall_spec_decode_num_accepted_tokens_per_pos_total"
    rows = [f'{pos}{{model="m",position="{i}",version=""}} {n}.0' for i, n in enumerate(per_pos)]
    assert all(row in text for row in rows), text


def test_an_engine_without_a_draft_exports_no_spec_decode_series() -> None:
    stats = VllmStats()
    record_scheduler_stats(stats, fake_step(None))
    s = engine_stats(stats)
    assert s.spec_decode is None
    ops = _EngineOpsFamilies()
    ops.add_stats(["m", ""], object(), s)
    assert "servehall_spec_decode_num_drafts_total{" not in _exposition(ops.families())
