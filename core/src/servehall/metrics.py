"""Prometheus metrics of the request path (``GET /metrics``).

Names follow Prometheus conventions (base units, ``_total`` counters). Labels are only
``model``, ``version`` (the ``[[models]] version`` label, empty for an unversioned
model; beside every ``model``), ``endpoint``, ``status`` (and ``reason`` for aborts and
engine restarts), plus ``tenant`` on the two scheduler families and the tenant
refusals: never a key or a principal id, so no secret or caller identity can reach a
metric label. Engine gauges (running, waiting, KV-cache usage) are read from
``Engine.stats()`` at scrape time; for models whose engine runs in a worker process
(``isolation = "process"``), ``servehall_engine_up{model}`` and
``servehall_engine_restarts_total{model,reason}`` come from its supervisor; the scheduler
families (``servehall_scheduler_queue{model,tenant}``,
``servehall_scheduler_service_tokens_total{model,tenant}``) from the scheduler's
``tenant_states()`` at scrape time, for policies that offer it (the built-in ones).

Operations families (deploy/prometheus rules and deploy/grafana read them; every name is
checked against a live server in tests/test_ops_metrics_e2e.py):

* ``servehall_inter_token_latency_seconds{model}``: gaps between output tokens after the
  first (a delta of n tokens after a gap g counts n gaps of g/n);
* ``servehall_tenant_refusals_total{tenant,status}``: requests of an authenticated tenant
  refused with 403, 429 or 503;
* ``servehall_request_errors_total{model,endpoint,status,code}``: answered requests with
  status >= 400, by the OpenAI ``error.code`` (``none`` when there was none);
* ``servehall_structured_output_requests_total{model,kind,outcome}``: requests with a
  structured-output constraint, ``outcome`` valid|invalid|length|refused (0 from start for
  each model, kind and outcome; the structured-output work increments it);
* ``servehall_prefix_cache_queries_total{model}`` / ``servehall_prefix_cache_hits_total
  {model}``: prompt tokens looked up in / found in the prefix cache, for engines that can
  tell (the torch engine with ``prefix_caching``, vLLM); none for the others (OpenVINO GenAI and
  ONNX Runtime GenAI report no hit counts);
* ``servehall_device_memory_used_bytes{model,device}`` / ``..._total_bytes``: from
  ``EngineStats`` (its per-device rows, else its one pair; absent when the engine cannot
  report them);
* ``servehall_engine_start_time_seconds{model}`` (Unix time the current engine came up),
  ``servehall_engine_last_exit{model,reason}`` (1 for the last reason a worker was lost,
  ``none`` before any), ``servehall_engine_oom_kills_total{model}``,
  ``servehall_engine_busy_silences_total{model}`` (heartbeat silences forgiven because
  ``/proc`` showed the worker busy, :mod:`servehall.worker.liveness`),
  ``servehall_engine_crash_loop{model}`` (1 once the supervisor gave up restarting);
* record sinks: ``servehall_sink_up{sink,required}``, ``servehall_sink_refusing{sink}``,
  ``servehall_sink_queued_records{sink}``, ``servehall_sink_write_failures_total{sink}``,
  ``servehall_sink_dropped_records_total{sink}``,
  ``servehall_audit_write_failures_total{sink}`` (failed writes of batches with audit
  events — the audit chain could not be extended),
  ``servehall_records_rejected_total{sink}`` (records the database refused for their
  content, quarantined in ``record_rejected`` or the sink's quarantine file);
* batches (``/v1/batches``): ``servehall_batch_lines_queued`` (lines waiting to run,
  every batch of the database, as the batch runner last read it),
  ``servehall_batch_lines_running`` (this replica's lines in flight),
  ``servehall_batch_lines_finished_total{outcome}`` (lines this replica ran to a stored
  result: ``completed`` or ``failed``), and the online/batch split of engine time:
  ``servehall_slot_seconds_total{model,version,class}`` (seconds admitted requests held
  an engine slot, from admission to their end; ``class`` ``online`` or ``batch``);
* ``servehall_config_revision`` (the running config revision; 0 until revisions exist)
  and ``servehall_config_info{sha256}`` (1, the digest of the effective config with secrets
  masked, as in the ``config.loaded`` audit event).

Endpoint picker (the Gateway API Inference Extension's EPP, llm-d-router; the metric
mapping for its ``engineConfigs`` is in docs/operations.md and deploy/k8s/): one series
each per replica, whatever models it serves —
``servehall_replica_requests_waiting`` (engine queues plus admission queues, summed over
models), ``servehall_replica_requests_running`` (engine running batches, summed),
``servehall_replica_kv_cache_usage_ratio`` (the largest KV-cache usage of its models,
0..1) — and ``servehall_cache_config_info{model,version,block_size,num_gpu_blocks}`` (1;
``block_size`` empty where the engine does not say).

Each :class:`Metrics` owns its own ``CollectorRegistry`` so several apps can live in one
process (tests) without clashing.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from prometheus_client import (
    REGISTRY,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from servehall.engines.contract import GRAMMAR_COMPILE_BUCKETS, GrammarStats

if TYPE_CHECKING:
    from servehall.engines.contract import EngineStats
    from servehall.plugin.host import Host

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

ABORT_REASONS: tuple[str, ...] = ("client_disconnect", "error")
TOOL_CALL_OUTCOMES: tuple[str, ...] = ("parsed", "failed")
"""``servehall_tool_calls_total`` outcomes: ``parsed`` (a named call whose arguments are a
JSON object), ``failed`` (arguments cut short or malformed, or a started call that never
named its function)."""
"""The ``reason`` label values of ``servehall_request_aborts_total``: the client went away
before the end, or the request failed after admission (engine or server error)."""

STRUCTURED_KINDS: tuple[str, ...] = (
    "json_object",
    "json_schema",
    "regex",
    "choice",
    "grammar",
    "structural_tag",
)
"""``kind`` values of ``servehall_structured_output_requests_total``."""

TENANT_REFUSALS = frozenset({403, 429, 503})
"""Statuses counted per tenant in ``servehall_tenant_refusals_total{tenant,status}``."""

STRUCTURED_OUTCOMES: tuple[str, ...] = ("valid", "invalid", "length", "refused")
"""``outcome`` values of ``servehall_structured_output_requests_total``: the output parsed
and matched, did not match, was cut by ``max_tokens``, or the model refused."""

MODEL_STATES: tuple[str, ...] = ("serving", "loading", "unloaded", "draining")
"""The ``state`` label values of ``servehall_model_state``."""

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
_TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28)
_MV = ("model", "version")


@dataclass(frozen=True, slots=True)
class _Family:
    """One metric family as a table row: ``kind`` is a ``prometheus_client`` metric class
    (``Counter``, ``Gauge``, ``Histogram``) or a ``*MetricFamily`` read at scrape time;
    ``name`` is the family's name without ``_total``; ``labels`` its label names."""

    kind: Any
    name: str
    doc: str
    labels: tuple[str, ...] = _MV
    buckets: tuple[float, ...] | None = None

    def scraped(self) -> Any:
        """A new, empty ``*MetricFamily`` of this row (one per scrape)."""
        return self.kind(self.name, self.doc, labels=list(self.labels))

    def registered(self, registry: CollectorRegistry) -> Any:
        """This row's ``Counter``/``Gauge``/``Histogram``, registered on ``registry``."""
        extra = {"buckets": self.buckets} if self.buckets is not None else {}
        return self.kind(self.name, self.doc, list(self.labels), registry=registry, **extra)


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

_REQUEST_FAMILIES: dict[str, _Family] = {
    "requests": _Family(
        Counter,
        "servehall_requests",
        "Finished HTTP inference requests",
        (*_MV, "endpoint", "status"),
    ),
    "ttft": _Family(
        Histogram,
        "servehall_time_to_first_token_seconds",
        "Time from arrival to first token",
        buckets=_LATENCY_BUCKETS,
    ),
    "tpot": _Family(
        Histogram,
        "servehall_time_per_output_token_seconds",
        "Mean decode time per output token after the first, per request",
        buckets=_TPOT_BUCKETS,
    ),
    "itl": _Family(
        Histogram,
        "servehall_inter_token_latency_seconds",
        "Gaps between output tokens after the first (a delta of n tokens: n gaps of 1/n)",
        buckets=_TPOT_BUCKETS,
    ),
    "tenant_refusals": _Family(
        Counter,
        "servehall_tenant_refusals",
        "Requests of a known tenant refused with 403, 429 or 503",
        ("tenant", "status"),
    ),
    "e2e": _Family(
        Histogram,
        "servehall_e2e_request_latency_seconds",
        "Arrival to last byte",
        buckets=_LATENCY_BUCKETS,
    ),
    "queue": _Family(
        Histogram,
        "servehall_queue_time_seconds",
        "Time waiting for an admission slot",
        buckets=_LATENCY_BUCKETS,
    ),
    "prompt_tokens": _Family(
        Counter, "servehall_prompt_tokens", "Prompt tokens of admitted requests"
    ),
    "generation_tokens": _Family(Counter, "servehall_generation_tokens", "Generated tokens"),
    "slot_seconds": _Family(
        Counter,
        "servehall_slot_seconds",
        "Seconds admitted requests held an engine slot (admission to the end), by class: "
        "online, or batch (a /v1/batches line)",
        (*_MV, "class"),
    ),
    "aborts": _Family(
        Counter,
        "servehall_request_aborts",
        "Requests aborted before finishing",
        (*_MV, "reason"),
    ),
    "canary_rollbacks": _Family(
        Counter,
        "servehall_canary_rollbacks",
        "Canary versions set to weight 0 by their rollback_if guard",
        (*_MV, "reason"),
    ),
    "config_revision": _Family(
        Gauge,
        "servehall_config_revision",
        "The config revision this replica runs (0: no revision recorded)",
        (),
    ),
    "batch_lines_queued": _Family(
        Gauge,
        "servehall_batch_lines_queued",
        "Batch lines waiting to run, every batch of the database (read by the batch runner)",
        (),
    ),
    "batch_lines_running": _Family(
        Gauge,
        "servehall_batch_lines_running",
        "Batch lines this replica's batch runner has in flight",
        (),
    ),
    "batch_lines_finished": _Family(
        Counter,
        "servehall_batch_lines_finished",
        "Batch lines this replica ran to a stored result, by outcome (completed, failed)",
        ("outcome",),
    ),
    "request_errors": _Family(
        Counter,
        "servehall_request_errors",
        "Answered requests with status >= 400, by error code",
        (*_MV, "endpoint", "status", "code"),
    ),
    "structured": _Family(
        Counter,
        "servehall_structured_output_requests",
        "Structured-output requests by response format kind and outcome (valid: the "
        "output parses and matches; invalid: it does not; length: cut at max_tokens; "
        "refused: a 400 for the constraint)",
        (*_MV, "kind", "outcome"),
    ),
    "tool_calls": _Family(
        Counter,
        "servehall_tool_calls",
        "Tool calls read from model output, by outcome (parsed, failed)",
        (*_MV, "outcome"),
    ),
}
"""The request path's families (:class:`Metrics`' attributes of the same keys)."""


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
        """Device memory and prefix-cache counters from one ``EngineStats`` (its
        per-device rows when it has them, else its one device's pair)."""
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


class Metrics:
    """The host's metric families (see the module docstring; the request path's are
    :data:`_REQUEST_FAMILIES`, one attribute per key)."""

    requests: Counter
    ttft: Histogram
    tpot: Histogram
    itl: Histogram
    tenant_refusals: Counter
    e2e: Histogram
    queue: Histogram
    prompt_tokens: Counter
    generation_tokens: Counter
    slot_seconds: Counter
    aborts: Counter
    canary_rollbacks: Counter
    config_revision: Gauge
    batch_lines_queued: Gauge
    batch_lines_running: Gauge
    batch_lines_finished: Counter
    request_errors: Counter
    structured: Counter
    tool_calls: Counter

    def __init__(self, host_ref: Callable[[], Host | None] = lambda: None) -> None:
        r = self.registry = CollectorRegistry(auto_describe=True)
        for attr, family in _REQUEST_FAMILIES.items():
            setattr(self, attr, family.registered(r))
        r.register(_EngineCollector(host_ref))
        r.register(_HostOpsCollector(host_ref))

    def start_series(self, models: Iterable[tuple[str, str]]) -> None:
        """Export a 0 sample for every label set known up front: each model's token
        counters (``models``: ``(name, version)`` pairs),
        ``servehall_request_aborts_total`` for each reason in
        :data:`ABORT_REASONS`, ``servehall_structured_output_requests_total`` for each
        kind and outcome and ``servehall_tool_calls_total`` for each outcome in
        :data:`TOOL_CALL_OUTCOMES` (Prometheus' advice for labelled counters: a series that
        appears only with its first event makes ``rate()`` and alerts on it blind until
        then)."""
        for model, version in models:
            self.prompt_tokens.labels(model, version)
            self.generation_tokens.labels(model, version)
            for reason in ABORT_REASONS:
                self.aborts.labels(model, version, reason)
            for kind in STRUCTURED_KINDS:
                for outcome in STRUCTURED_OUTCOMES:
                    self.structured.labels(model, version, kind, outcome)
            for outcome in TOOL_CALL_OUTCOMES:
                self.tool_calls.labels(model, version, outcome)

    def render(self) -> bytes:
        """The text exposition format: the host's families, then those on
        ``prometheus_client``'s default registry (where plugins such as the safety
        filter register their counters, and the process/GC collectors live)."""
        return bytes(generate_latest(self.registry)) + bytes(generate_latest(REGISTRY))
