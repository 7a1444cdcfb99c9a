"""Prometheus metrics of the request path (``GET /metrics``).

Names follow Prometheus conventions (base units, ``_total`` counters). Labels are only
``model``, ``version`` (the ``[[models]] version`` label, empty for an unversioned
model; beside every ``model``), ``endpoint``, ``status`` (and ``reason`` for aborts and
engine restarts),
plus ``tenant`` on the two scheduler families: never a key or a principal id, so no
secret or caller identity can reach a metric label. Engine gauges (running, waiting,
KV-cache usage) are read from ``Engine.stats()`` at scrape time; for models whose engine
runs in a worker process (``isolation = "process"``), ``servehall_engine_up{model}`` and
``servehall_engine_restarts_total{model,reason}`` come from its supervisor; the scheduler
families (``servehall_scheduler_queue{model,tenant}``,
``servehall_scheduler_service_tokens_total{model,tenant}``) from the scheduler's
``tenant_states()`` at scrape time, for policies that offer it (the built-in ones).

Each :class:`Metrics` owns its own ``CollectorRegistry`` so several apps can live in one
process (tests) without clashing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from prometheus_client import (
    REGISTRY,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from servehall.plugin.host import Host

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

ABORT_REASONS: tuple[str, ...] = ("client_disconnect", "error")
"""The ``reason`` label values of ``servehall_request_aborts_total``: the client went away
before the end, or the request failed after admission (engine or server error)."""

MODEL_STATES: tuple[str, ...] = ("serving", "loading", "unloaded", "draining")
"""The ``state`` label values of ``servehall_model_state``."""

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
_TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28)


class _EngineCollector(Collector):
    def __init__(self, host_ref: Callable[[], Host | None]) -> None:
        self._host_ref = host_ref

    def collect(self) -> Iterable[Metric]:
        running = GaugeMetricFamily(
            "servehall_requests_running",
            "Engine requests in the running batch",
            labels=["model", "version"],
        )
        waiting = GaugeMetricFamily(
            "servehall_requests_waiting",
            "Requests waiting: engine queue plus admission queue",
            labels=["model", "version"],
        )
        kv = GaugeMetricFamily(
            "servehall_kv_cache_usage_ratio",
            "KV-cache blocks used / total (0..1)",
            labels=["model", "version"],
        )
        kv_used = GaugeMetricFamily(
            "servehall_kv_cache_blocks_used", "KV-cache blocks in use", labels=["model", "version"]
        )
        up = GaugeMetricFamily(
            "servehall_engine_up",
            "1 while the model's engine worker process runs and serves, else 0",
            labels=["model", "version"],
        )
        restarts = CounterMetricFamily(
            "servehall_engine_restarts",
            "Engine worker restarts, by the reason the worker was lost",
            labels=["model", "version", "reason"],
        )
        queue = GaugeMetricFamily(
            "servehall_scheduler_queue",
            "Requests waiting in the admission queue, per tenant",
            labels=["model", "version", "tenant"],
        )
        service = CounterMetricFamily(
            "servehall_scheduler_service_tokens",
            "Tokens served per tenant: prompt tokens at admission plus generated tokens",
            labels=["model", "version", "tenant"],
        )
        loads = CounterMetricFamily(
            "servehall_model_loads",
            "Engine starts of a model version (startup, live config, loads on demand)",
            labels=["model", "version"],
        )
        load_s = GaugeMetricFamily(
            "servehall_model_load_seconds",
            "Wall time of the version's last engine start",
            labels=["model", "version"],
        )
        state = GaugeMetricFamily(
            "servehall_model_state",
            "1 for the version's current state (serving, loading, unloaded, draining)",
            labels=["model", "version", "state"],
        )
        host = self._host_ref()
        for served in list(host.models.values()) if host else []:
            name, ver = served.name, served.version
            loads.add_metric([name, ver], served.loads)
            load_s.add_metric([name, ver], served.last_load_s)
            for st in MODEL_STATES:
                state.add_metric([name, ver, st], 1.0 if served.state == st else 0.0)
            counts = getattr(served.engine, "restart_counts", None)
            if counts is not None:  # an engine in a supervised worker process
                up.add_metric([name, ver], 1.0 if served.engine.worker_up else 0.0)  # type: ignore[attr-defined]
                for reason, n in sorted(counts.items()):
                    restarts.add_metric([name, ver, reason], n)
            tenant_states = getattr(served.scheduler, "tenant_states", None)
            if tenant_states is not None:
                for tenant, st in tenant_states().items():
                    queue.add_metric([name, ver, tenant], st.waiting)
                    service.add_metric([name, ver, tenant], st.service_tokens)
            try:
                s = served.engine.stats()
            except Exception:  # a scrape must never fail because of one engine
                continue
            running.add_metric([name, ver], s.running)
            waiting.add_metric([name, ver], s.waiting + served.scheduler.waiting)
            total = s.kv_cache_blocks_total
            kv.add_metric([name, ver], (s.kv_cache_blocks_used / total) if total else 0.0)
            kv_used.add_metric([name, ver], s.kv_cache_blocks_used)
        return [running, waiting, kv, kv_used, up, restarts, queue, service, loads, load_s, state]


class Metrics:
    """The host's metric families (see the module docstring)."""

    def __init__(self, host_ref: Callable[[], Host | None] = lambda: None) -> None:
        r = self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter(
            "servehall_requests",
            "Finished HTTP inference requests",
            ["model", "version", "endpoint", "status"],
            registry=r,
        )
        self.ttft = Histogram(
            "servehall_time_to_first_token_seconds",
            "Time from arrival to first token",
            ["model", "version"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.tpot = Histogram(
            "servehall_time_per_output_token_seconds",
            "Mean decode time per output token after the first, per request",
            ["model", "version"],
            buckets=_TPOT_BUCKETS,
            registry=r,
        )
        self.e2e = Histogram(
            "servehall_e2e_request_latency_seconds",
            "Arrival to last byte",
            ["model", "version"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.queue = Histogram(
            "servehall_queue_time_seconds",
            "Time waiting for an admission slot",
            ["model", "version"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.prompt_tokens = Counter(
            "servehall_prompt_tokens",
            "Prompt tokens of admitted requests",
            ["model", "version"],
            registry=r,
        )
        self.generation_tokens = Counter(
            "servehall_generation_tokens", "Generated tokens", ["model", "version"], registry=r
        )
        self.aborts = Counter(
            "servehall_request_aborts",
            "Requests aborted before finishing",
            ["model", "version", "reason"],
            registry=r,
        )
        self.canary_rollbacks = Counter(
            "servehall_canary_rollbacks",
            "Canary versions set to weight 0 by their rollback_if guard",
            ["model", "version", "reason"],
            registry=r,
        )
        self.config_revision = Gauge(
            "servehall_config_revision",
            "The config revision this replica runs (0: no revision recorded)",
            registry=r,
        )
        r.register(_EngineCollector(host_ref))

    def start_series(self, models: Iterable[tuple[str, str]]) -> None:
        """Export a 0 sample for every label set known up front: each model's token
        counters (``models``: ``(name, version)`` pairs) and
        ``servehall_request_aborts_total`` for each reason in
        :data:`ABORT_REASONS` (Prometheus' advice for labelled counters: a series that
        appears only with its first event makes ``rate()`` and alerts on it blind until
        then)."""
        for model, version in models:
            self.prompt_tokens.labels(model, version)
            self.generation_tokens.labels(model, version)
            for reason in ABORT_REASONS:
                self.aborts.labels(model, version, reason)

    def render(self) -> bytes:
        """The text exposition format: the host's families, then those on
        ``prometheus_client``'s default registry (where plugins such as the safety
        filter register their counters, and the process/GC collectors live)."""
        return bytes(generate_latest(self.registry)) + bytes(generate_latest(REGISTRY))
