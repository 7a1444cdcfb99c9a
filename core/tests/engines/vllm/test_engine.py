"""The vLLM engine's stats mapping, without vLLM (it lives in .venv-vllm; the real
engine's figures are checked end to end in tests/test_vllm_e2e.py): a fake
``SchedulerStats`` object per step → ``EngineStats`` (prefix-cache totals, KV usage),
device-memory rows on CUDA (a fake reader) and none on the CPU build, and the rows'
way through the worker's heartbeat to ``servehall_device_memory_*{device}``."""

from __future__ import annotations

from types import SimpleNamespace

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import Metric

from servehall.engines.contract import EngineStats
from servehall.engines.vllm.engine import (
    _DeviceMemory,
    _Stats,
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
    stats = _Stats()
    stats.kv_blocks_total = 200
    record_scheduler_stats(stats, fake_step(100, 40))
    record_scheduler_stats(stats, fake_step(60, 60, usage=0.5))
    s = engine_stats(stats)
    assert (s.running, s.waiting) == (2, 1)
    assert (s.kv_cache_blocks_used, s.kv_cache_blocks_total) == (100, 200)
    assert (s.prefix_cache_queries, s.prefix_cache_hits) == (160, 100)  # per step, summed
    assert s.devices == () and s.device_memory_total_bytes is None


def test_fake_vllm_stats_without_prefix_caching_report_no_prefix_figures() -> None:
    stats = _Stats()
    record_scheduler_stats(stats, fake_step(None))
    s = engine_stats(stats)
    assert s.prefix_cache_queries is None and s.prefix_cache_hits is None


def test_device_memory_rows_on_cuda_are_read_at_most_once_a_second_and_none_on_cpu() -> None:
    calls: list[int] = []

    def read(count: int) -> tuple[tuple[str, int, int], ...]:
        calls.append(count)
        return tuple((f"cuda:{i}", 10 + i, 100) for i in range(count))

    gpu = _DeviceMemory("cuda", 2, every_s=60.0, read=read)
    assert gpu.get() == (("cuda:0", 10, 100), ("cuda:1", 11, 100))
    assert gpu.get() == (("cuda:0", 10, 100), ("cuda:1", 11, 100))
    assert calls == [2]
    cpu = _DeviceMemory("cpu", 1, read=read)
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
