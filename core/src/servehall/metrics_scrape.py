"""The scrape-time collectors of ``GET /metrics``: what is read from the host when
Prometheus scrapes — each model's engine stats (running, waiting, KV cache, engine up and
restarts, grammar compiles), the scheduler queues, the endpoint picker's per-replica
series, the model states, the record sinks and the config digest. The families of the
request path, and what every family means, are in :mod:`servehall.metrics`."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from servehall.engines.contract import GRAMMAR_COMPILE_BUCKETS, GrammarStats
from servehall.metrics import _MV, MODEL_STATES, _Family

if TYPE_CHECKING:
    from servehall.engines.contract import EngineStats
    from servehall.plugin.host import Host


def host_collectors(host_ref: Callable[[], Host | None]) -> list[Collector]:
    """The collectors :class:`~servehall.metrics.Metrics` registers for the host that
    ``host_ref`` returns (None: nothing to read yet)."""
    return [_EngineCollector(host_ref), _HostOpsCollector(host_ref)]


def _scraped(table: dict[str, _Family]) -> dict[str, Any]:
    """One empty ``*MetricFamily`` per row of ``table``, by the row's key (in its order)."""
    return {key: family.scraped() for key, family in table.items()}


_G, _C, _H = GaugeMetricFamily, CounterMetricFamily, HistogramMetricFamily

_ENGINE_FAMILIES: dict[str, _Family] = {
    "running": _Family(_G, "servehall_requests_running", "Engine requests in the running batch"),
    "waiting": _Family(
        _G, "servehall_requests_waiting", "Requests waiting: engine queue plus admission queue"
    ),
    "kv": _Family(_G, "servehall_kv_cache_usage_ratio", "KV-cache blocks used / total (0..1)"),
    "kv_used": _Family(_G, "servehall_kv_cache_blocks_used", "KV-cache blocks in use"),
    "up": _Family(
        _G,
        "servehall_engine_up",
        "1 while the model's engine worker process runs and serves, else 0",
    ),
    "restarts": _Family(
        _C,
        "servehall_engine_restarts",
        "Engine worker restarts, by the reason the worker was lost",
        (*_MV, "reason"),
    ),
    "queue": _Family(
        _G,
        "servehall_scheduler_queue",
        "Requests waiting in the admission queue, per tenant",
        (*_MV, "tenant"),
    ),
    "service": _Family(
        _C,
        "servehall_scheduler_service_tokens",
        "Tokens served per tenant: prompt tokens at admission plus generated tokens",
        (*_MV, "tenant"),
    ),
    "loads": _Family(
        _C,
        "servehall_model_loads",
        "Engine starts of a model version (startup, live config, loads on demand)",
    ),
    "load_s": _Family(
        _G, "servehall_model_load_seconds", "Wall time of the version's last engine start"
    ),
    "state": _Family(
        _G,
        "servehall_model_state",
        "1 for the version's current state (serving, loading, unloaded, draining)",
        (*_MV, "state"),
    ),
    "compile": _Family(
        _H,
        "servehall_grammar_compile_seconds",
        "Structured-output grammar compile time in the engine (cache misses)",
    ),
    "cache_hits": _Family(
        _C,
        "servehall_grammar_cache_hits",
        "Structured-output constraints found compiled in the engine's LRU cache",
    ),
}
"""The per-model families read from the engines at scrape time (in exposition order)."""

_ENGINE_OPS_FAMILIES: dict[str, _Family] = {
    "start": _Family(
        _G, "servehall_engine_start_time_seconds", "Unix time the model's current engine came up"
    ),
    "last_exit": _Family(
        _G,
        "servehall_engine_last_exit",
        "1 for the reason the model's engine worker was last lost (none: never)",
        (*_MV, "reason"),
    ),
    "oom": _Family(
        _C,
        "servehall_engine_oom_kills",
        "Engine worker processes killed by the kernel's OOM killer",
    ),
    "busy_silences": _Family(
        _C,
        "servehall_engine_busy_silences",
        "Heartbeat silences of the model's worker forgiven because /proc showed it busy",
    ),
    "crash_loop": _Family(
        _G,
        "servehall_engine_crash_loop",
        "1 once the supervisor stopped restarting the model's worker (crash loop)",
    ),
    "mem_used": _Family(
        _G,
        "servehall_device_memory_used_bytes",
        "Device memory in use, as the model's engine reports it",
        (*_MV, "device"),
    ),
    "mem_total": _Family(
        _G,
        "servehall_device_memory_total_bytes",
        "Device memory in all, as the model's engine reports it",
        (*_MV, "device"),
    ),
    "prefix_queries": _Family(
        _C,
        "servehall_prefix_cache_queries",
        "Prompt tokens looked up in the prefix cache (engines that can tell)",
    ),
    "prefix_hits": _Family(
        _C,
        "servehall_prefix_cache_hits",
        "Prompt tokens found in the prefix cache (engines that can tell)",
    ),
    "sd_drafts": _Family(
        _C,
        "servehall_spec_decode_num_drafts",
        "Speculative decoding: verification steps with draft tokens (models with a draft)",
    ),
    "sd_draft_tokens": _Family(
        _C,
        "servehall_spec_decode_num_draft_tokens",
        "Speculative decoding: draft tokens proposed (models with a draft)",
    ),
    "sd_accepted": _Family(
        _C,
        "servehall_spec_decode_num_accepted_tokens",
        "Speculative decoding: draft tokens accepted by the model (models with a draft)",
    ),
    "sd_accepted_pos": _Family(
        _C,
        "servehall_spec_decode_num_accepted_tokens_per_pos",
        "Speculative decoding: accepted draft tokens by position in the draft (0 = first)",
        (*_MV, "position"),
    ),
}
"""The operations families of each model's engine (module docstring)."""

_SINK_FAMILIES: dict[str, _Family] = {
    "up": _Family(
        _G,
        "servehall_sink_up",
        "1 while the record sink writes (or its check passes), else 0",
        ("sink", "required"),
    ),
    "refusing": _Family(
        _G,
        "servehall_sink_refusing",
        "1 while a required sink makes this replica refuse new requests (503)",
        ("sink",),
    ),
    "queued": _Family(
        _G,
        "servehall_sink_queued_records",
        "Records waiting to be written (memory and spill file)",
        ("sink",),
    ),
    "failures": _Family(
        _C, "servehall_sink_write_failures", "Failed sink write attempts", ("sink",)
    ),
    "dropped": _Family(
        _C,
        "servehall_sink_dropped_records",
        "Records a sink dropped (buffer and spill file full, not required)",
        ("sink",),
    ),
    "audit": _Family(
        _C,
        "servehall_audit_write_failures",
        "Failed writes of batches holding audit events (the chain was not extended)",
        ("sink",),
    ),
    "rejected": _Family(
        _C,
        "servehall_records_rejected",
        "Records the database refused for their content while it took others, "
        "quarantined (record_rejected table or quarantine file)",
        ("sink",),
    ),
    "info": _Family(
        _G,
        "servehall_config_info",
        "1, labelled with the sha256 of the effective config (secrets masked)",
        ("sha256",),
    ),
}
"""Record sinks and the config digest (module docstring)."""


class _EngineCollector(Collector):
    def __init__(self, host_ref: Callable[[], Host | None]) -> None:
        self._host_ref = host_ref

    def collect(self) -> Iterable[Metric]:
        f = _scraped(_ENGINE_FAMILIES)
        picker = _PickerFamilies()
        ops = _EngineOpsFamilies()
        host = self._host_ref()
        for served in list(host.models.values()) if host else []:
            name, ver = served.name, served.version
            engine = served.engine
            f["loads"].add_metric([name, ver], served.loads)
            f["load_s"].add_metric([name, ver], served.last_load_s)
            for st in MODEL_STATES:
                f["state"].add_metric([name, ver, st], 1.0 if served.state == st else 0.0)
            counts = getattr(engine, "restart_counts", None)
            if counts is not None:  # an engine in a supervised worker process
                f["up"].add_metric([name, ver], 1.0 if engine.worker_up else 0.0)  # type: ignore[attr-defined]
                for reason, n in sorted(counts.items()):
                    f["restarts"].add_metric([name, ver, reason], n)
            ops.add_supervision([name, ver], engine)
            tenant_states = getattr(served.scheduler, "tenant_states", None)
            if tenant_states is not None:
                for tenant, st in tenant_states().items():
                    f["queue"].add_metric([name, ver, tenant], st.waiting)
                    f["service"].add_metric([name, ver, tenant], st.service_tokens)
            try:
                s = served.engine.stats()
            except Exception:  # a scrape must never fail because of one engine
                continue
            if "structured_output" in served.engine.supported_params:
                g = s.grammar or GrammarStats()
                buckets = g.compile_buckets or (0,) * len(GRAMMAR_COMPILE_BUCKETS)
                f["compile"].add_metric(
                    [name, ver],
                    [
                        *(
                            (repr(b), n)
                            for b, n in zip(GRAMMAR_COMPILE_BUCKETS, buckets, strict=True)
                        ),
                        ("+Inf", g.misses),
                    ],
                    g.compile_seconds_sum,
                )
                f["cache_hits"].add_metric([name, ver], g.hits)
            f["running"].add_metric([name, ver], s.running)
            f["waiting"].add_metric([name, ver], s.waiting + served.scheduler.waiting)
            f["kv"].add_metric([name, ver], s.kv_cache_usage)
            f["kv_used"].add_metric([name, ver], s.kv_cache_blocks_used)
            picker.add([name, ver], engine, s, served.scheduler.waiting)
            ops.add_stats([name, ver], engine, s)
        return [*f.values(), *ops.families(), *picker.families()]


class _PickerFamilies:
    """The replica-wide gauges an endpoint picker reads (module docstring, "Endpoint
    picker"): one series each, whatever the models, so a picker's metric spec needs no
    label; plus ``servehall_cache_config_info`` per model."""

    def __init__(self) -> None:
        self.running = 0
        self.waiting = 0
        self.kv = 0.0
        self.cache_info = GaugeMetricFamily(
            "servehall_cache_config_info",
            "1, with the model's KV-cache geometry as labels (block_size in tokens, "
            "num_gpu_blocks: KV-cache blocks in all, on whatever device)",
            labels=["model", "version", "block_size", "num_gpu_blocks"],
        )

    def add(self, model: list[str], engine: object, s: EngineStats, admission: int) -> None:
        """Count one model's engine stats and admission-queue length in."""
        self.running += s.running
        self.waiting += s.waiting + admission
        self.kv = max(self.kv, s.kv_cache_usage)
        block = _extra_of(engine).get("kv_block_size")
        self.cache_info.add_metric(
            [*model, str(block) if block else "", str(s.kv_cache_blocks_total)], 1.0
        )

    def families(self) -> list[Metric]:
        return [
            GaugeMetricFamily(
                "servehall_replica_requests_waiting",
                "Requests waiting on this replica: engine queues plus admission queues, all models",
                value=self.waiting,
            ),
            GaugeMetricFamily(
                "servehall_replica_requests_running",
                "Requests in the engines' running batches on this replica, all models",
                value=self.running,
            ),
            GaugeMetricFamily(
                "servehall_replica_kv_cache_usage_ratio",
                "The largest KV-cache usage (blocks used / total, 0..1) of this replica's models",
                value=self.kv,
            ),
            self.cache_info,
        ]


class _EngineOpsFamilies:
    """Per-model operations families read at scrape time (module docstring)."""

    def __init__(self) -> None:
        self.f = _scraped(_ENGINE_OPS_FAMILIES)

    def add_supervision(self, model: list[str], engine: object) -> None:
        """Start time, last exit, OOM kills, busy silences and crash loop of ``engine``
        (attributes an engine may offer: ``started_at`` (Unix s), ``last_exit_reason``,
        ``oom_kills``, ``busy_silences``, ``crash_looping``;
        :class:`~servehall.worker.client.ProcessEngine` offers all)."""
        started = getattr(engine, "started_at", None)
        if started:
            self.f["start"].add_metric(model, float(started))
        reason = getattr(engine, "last_exit_reason", None)
        if reason is not None:
            self.f["last_exit"].add_metric([*model, reason or "none"], 1.0)
        oom = getattr(engine, "oom_kills", None)
        if oom is not None:
            self.f["oom"].add_metric(model, float(oom))
        busy = getattr(engine, "busy_silences", None)
        if busy is not None:
            self.f["busy_silences"].add_metric(model, float(busy))
        loop = getattr(engine, "crash_looping", None)
        if loop is not None:
            self.f["crash_loop"].add_metric(model, 1.0 if loop else 0.0)

    def add_stats(self, model: list[str], engine: object, s: EngineStats) -> None:
        """Device memory, prefix-cache and speculative-decoding counters from one
        ``EngineStats`` (its per-device rows when it has them, else its one device's
        pair; the speculative-decoding families only for an engine with a draft)."""
        for device, used, total in s.devices:
            self.f["mem_total"].add_metric([*model, device], float(total))
            self.f["mem_used"].add_metric([*model, device], float(used))
        if s.device_memory_total_bytes and not s.devices:
            device = _device_of(engine)
            self.f["mem_total"].add_metric([*model, device], float(s.device_memory_total_bytes))
            self.f["mem_used"].add_metric([*model, device], float(s.device_memory_used_bytes or 0))
        if s.prefix_cache_queries is not None:
            self.f["prefix_queries"].add_metric(model, float(s.prefix_cache_queries))
            self.f["prefix_hits"].add_metric(model, float(s.prefix_cache_hits or 0))
        sd = s.spec_decode
        if sd is not None:
            self.f["sd_drafts"].add_metric(model, float(sd.drafts))
            if sd.draft_tokens is not None:
                self.f["sd_draft_tokens"].add_metric(model, float(sd.draft_tokens))
            self.f["sd_accepted"].add_metric(model, float(sd.accepted_tokens))
            for pos, n in enumerate(sd.accepted_per_position):
                self.f["sd_accepted_pos"].add_metric([*model, str(pos)], float(n))

    def families(self) -> list[Metric]:
        """The families in exposition order."""
        return list(self.f.values())


def _extra_of(engine: object) -> dict[str, object]:
    """``engine.model_info.extra`` ({} when the engine cannot say)."""
    try:
        extra = engine.model_info.extra  # type: ignore[attr-defined]
    except Exception:
        return {}
    return extra if isinstance(extra, dict) else {}


def _device_of(engine: object) -> str:
    """The device an engine runs on, from ``model_info.extra["device"]`` ("" unknown)."""
    return str(_extra_of(engine).get("device", ""))


class _HostOpsCollector(Collector):
    """Record sinks and the config revision (module docstring)."""

    def __init__(self, host_ref: Callable[[], Host | None]) -> None:
        self._host_ref = host_ref

    def collect(self) -> Iterable[Metric]:
        f = _scraped(_SINK_FAMILIES)
        host = self._host_ref()
        runners = getattr(host.records, "runners", ()) if host is not None else ()
        for r in runners:
            try:
                st = r.stats()
            except Exception:  # a scrape must never fail because of one sink
                continue
            name = str(st["sink"])
            f["up"].add_metric([name, "true" if st["required"] else "false"], float(st["healthy"]))
            f["refusing"].add_metric([name], float(st["refusing"]))
            f["queued"].add_metric([name], float(st["queued"]))
            f["failures"].add_metric([name], float(st["failures"]))
            f["dropped"].add_metric([name], float(st["dropped"]))
            f["audit"].add_metric([name], float(st.get("audit_failures", 0)))
            f["rejected"].add_metric([name], float(st.get("rejected", 0)))
        if host is not None:
            f["info"].add_metric([config_digest(host)], 1.0)
        return list(f.values())


def config_digest(host: Host) -> str:
    """sha256 hex of the host's effective config with secrets masked (the digest of the
    ``config.loaded`` audit event); computed once per host."""
    cached: str | None = getattr(host, "_config_sha256", None)
    if cached is None:
        from servehall.config.settings import masked_dump
        from servehall.records.bus import config_digest as digest

        cached = digest(masked_dump(host.settings))
        with contextlib.suppress(Exception):
            host._config_sha256 = cached  # type: ignore[attr-defined]
    return cached
