"""vLLM's statistics as servehall's :class:`~servehall.EngineStats`: a vLLM stat logger
(:func:`stats_logger_factory`) copies each engine step's scheduler statistics into a
:class:`VllmStats` (running, waiting, KV-cache usage, prefix-cache queries and hits and
speculative-decoding counts, summed since start); :func:`engine_stats` turns them into
``EngineStats`` with the device memory of the CUDA/ROCm devices the model runs on
(:class:`DeviceMemory`, ``torch.cuda.mem_get_info`` in this process, at most once a
second: device-wide figures, so they include vLLM's engine-core process; the first
read creates a CUDA context in this process). On the CPU build no device memory is
reported: vLLM's KV cache there is a fixed ``kv_cache_space_gib`` of host RAM, shown by
the KV-cache usage. Used by :class:`servehall.engines.vllm.engine.VllmEngine`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from servehall.engines.contract import EngineStats, SpecDecodeStats


class VllmStats:
    """vLLM's scheduler statistics as last recorded (written by :class:`VllmStatsLogger`)."""

    def __init__(self) -> None:
        self.running = 0
        self.waiting = 0
        self.kv_usage = 0.0
        self.kv_blocks_total = 1
        self.prefix_queries = 0
        self.prefix_hits = 0
        self.prefix_seen = False  # vLLM reported prefix-cache stats (prefix caching is on)
        self.spec: SpecDecodeStats | None = None  # totals since start, once vLLM reported any


def record_scheduler_stats(stats: VllmStats, scheduler_stats: Any) -> None:
    """Copy one step's vLLM ``SchedulerStats`` into ``stats``: running and waiting
    requests and KV-cache usage as they are; the step's prefix-cache ``queries`` and
    ``hits`` (tokens; vLLM reports them per step, None when prefix caching is off) added
    to the totals since start; the step's speculative-decoding counts
    (``SpecDecodingStats``: drafts, draft tokens, accepted tokens and accepted tokens per
    draft position; None without a ``speculative_config``) added to theirs."""
    stats.running = scheduler_stats.num_running_reqs
    stats.waiting = scheduler_stats.num_waiting_reqs
    stats.kv_usage = float(scheduler_stats.kv_cache_usage)
    pc = getattr(scheduler_stats, "prefix_cache_stats", None)
    if pc is not None:
        stats.prefix_seen = True
        stats.prefix_queries += int(pc.queries)
        stats.prefix_hits += int(pc.hits)
    sd = getattr(scheduler_stats, "spec_decoding_stats", None)
    if sd is not None:
        stats.spec = add_spec_decoding(stats.spec, sd)


def add_spec_decoding(total: SpecDecodeStats | None, step: Any) -> SpecDecodeStats:
    """``total`` (None: nothing yet) plus one step's vLLM ``SpecDecodingStats``
    (``num_drafts``, ``num_draft_tokens``, ``num_accepted_tokens``,
    ``num_accepted_tokens_per_pos``; the per-position lists are added position by
    position, the longer one's length kept)."""
    base = total or SpecDecodeStats()
    per_pos = [int(n) for n in step.num_accepted_tokens_per_pos or ()]
    old = list(base.accepted_per_position)
    if len(old) < len(per_pos):
        old += [0] * (len(per_pos) - len(old))
    for i, n in enumerate(per_pos):
        old[i] += n
    return SpecDecodeStats(
        drafts=base.drafts + int(step.num_drafts),
        draft_tokens=(base.draft_tokens or 0) + int(step.num_draft_tokens),
        accepted_tokens=base.accepted_tokens + int(step.num_accepted_tokens),
        accepted_per_position=tuple(old),
    )


def engine_stats(stats: VllmStats, devices: tuple[tuple[str, int, int], ...] = ()) -> EngineStats:
    """``EngineStats`` from the recorded vLLM stats: KV blocks used (usage × total) and
    total, prefix-cache totals (None until vLLM reported any: prefix caching off), and
    ``devices`` as given (:func:`cuda_devices`)."""
    total = max(stats.kv_blocks_total, 1)
    used = min(total, round(stats.kv_usage * total))
    return EngineStats(
        running=stats.running,
        waiting=stats.waiting,
        kv_cache_blocks_used=used,
        kv_cache_blocks_total=total,
        prefix_cache_queries=stats.prefix_queries if stats.prefix_seen else None,
        prefix_cache_hits=stats.prefix_hits if stats.prefix_seen else None,
        devices=devices,
        spec_decode=stats.spec,
    )


def cuda_devices(count: int) -> tuple[tuple[str, int, int], ...]:
    """``(device, used bytes, total bytes)`` of the first ``count`` visible CUDA (or ROCm)
    devices, from ``torch.cuda.mem_get_info`` (device-wide: every process on it); ()
    when torch or a device is missing or the driver call fails."""
    try:
        import torch

        n = min(count, torch.cuda.device_count())
        rows = []
        for i in range(n):
            free, total = torch.cuda.mem_get_info(i)
            rows.append((f"cuda:{i}", int(total - free), int(total)))
        return tuple(rows)
    except Exception:
        return ()


class DeviceMemory:
    """The device rows of :func:`cuda_devices`, read at most every ``every_s`` seconds
    (``stats()`` runs with each heartbeat); always () on a CPU backend."""

    def __init__(
        self,
        backend: str,
        count: int,
        every_s: float = 1.0,
        read: Callable[[int], tuple[tuple[str, int, int], ...]] = cuda_devices,
    ) -> None:
        self.on_gpu = backend in ("cuda", "rocm")
        self.count = count
        self.every_s = every_s
        self.read = read
        self.rows: tuple[tuple[str, int, int], ...] = ()
        self.at = -float("inf")

    def get(self) -> tuple[tuple[str, int, int], ...]:
        if not self.on_gpu:
            return ()
        now = time.monotonic()
        if now - self.at >= self.every_s:
            self.rows, self.at = self.read(self.count), now
        return self.rows


def stats_logger_factory(stats: VllmStats) -> Any:
    """A vLLM ``StatLoggerFactory`` whose loggers copy each step's scheduler stats into
    ``stats`` (vLLM calls ``record`` on the event loop after every engine-core output)."""
    from vllm.v1.metrics.loggers import StatLoggerBase

    class StatsLogger(StatLoggerBase):
        def __init__(self, vllm_config: Any, engine_index: int = 0) -> None:
            self.vllm_config = vllm_config

        def record(
            self,
            scheduler_stats: Any,
            iteration_stats: Any,
            *args: Any,
            **kwargs: Any,
        ) -> None:
            if scheduler_stats is not None:
                record_scheduler_stats(stats, scheduler_stats)

        def log_engine_initialized(self) -> None:
            blocks = self.vllm_config.cache_config.num_gpu_blocks
            if blocks:
                stats.kv_blocks_total = int(blocks)

        def log(self) -> None:
            pass

    return StatsLogger
