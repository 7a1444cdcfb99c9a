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
* ``servehall_spec_decode_num_drafts_total{model}``,
  ``servehall_spec_decode_num_draft_tokens_total{model}``,
  ``servehall_spec_decode_num_accepted_tokens_total{model}`` and
  ``servehall_spec_decode_num_accepted_tokens_per_pos_total{model,position}``: speculative
  decoding (vLLM's ``vllm:spec_decode_*``), from ``EngineStats.spec_decode``; samples only
  for models with a draft (vLLM's ``speculative_config``: vLLM's own counts; openvino_cpu's
  ``draft_model``: derived from its step API, see its README; no draft-token series under
  ``assistant_confidence_threshold``);
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
  ``servehall_batch_lines_running`` (this replica's lines being sent),
  ``servehall_batch_lines_finished_total{outcome}`` (lines this replica ran to a stored
  result: ``completed`` or ``failed``), ``servehall_batch_lines_preempted_total`` (lines
  stopped for online traffic, ``[batches] preempt``), and the online/batch split of engine time:
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

import bisect
from collections.abc import Callable, Iterable, Sequence
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

if TYPE_CHECKING:
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
        "Batch lines this replica's batch runner is sending to the engine",
        (),
    ),
    "batch_lines_finished": _Family(
        Counter,
        "servehall_batch_lines_finished",
        "Batch lines this replica ran to a stored result, by outcome (completed, failed)",
        ("outcome",),
    ),
    "batch_lines_preempted": _Family(
        Counter,
        "servehall_batch_lines_preempted",
        "Batch lines this replica's runner stopped for online traffic (each runs again)",
        (),
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
    "api_process_restarts": _Family(
        Counter,
        "servehall_api_process_restarts",
        "HTTP frontend processes started again after they died ([server] api_processes > 1)",
        (),
    ),
}
"""The request path's families (:class:`Metrics`' attributes of the same keys)."""


def observe_all(child: Any, values: Sequence[float]) -> None:
    """``child.observe(v)`` for every ``v`` of ``values`` on one histogram child (its
    ``.labels(...)``), as one update per bucket hit and one to the sum instead of one
    per value: the same counts and sum (the sum up to float rounding), for a request's
    inter-token gaps (one per generated token; per-token ``observe`` calls were a
    profiled cost, docs/performance.md, issue 38 item 2). A child without
    ``prometheus_client``'s internal bucket fields is observed value by value."""
    bounds = getattr(child, "_upper_bounds", None)
    buckets = getattr(child, "_buckets", None)
    total = getattr(child, "_sum", None)
    if bounds is None or buckets is None or total is None or len(buckets) != len(bounds):
        for v in values:
            child.observe(v)
        return
    hits: dict[int, int] = {}
    top = bounds[-1]
    for v in values:
        if v <= top:  # as in observe: a value above every bound (or NaN) hits none
            i = bisect.bisect_left(bounds, v)  # the first bound >= v: observe's bucket
            hits[i] = hits.get(i, 0) + 1
    total.inc(sum(values))
    for i, n in hits.items():
        buckets[i].inc(n)


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
    batch_lines_preempted: Counter
    request_errors: Counter
    structured: Counter
    tool_calls: Counter
    api_process_restarts: Counter

    def __init__(self, host_ref: Callable[[], Host | None] = lambda: None) -> None:
        r = self.registry = CollectorRegistry(auto_describe=True)
        for attr, family in _REQUEST_FAMILIES.items():
            setattr(self, attr, family.registered(r))
        from servehall.metrics_scrape import host_collectors

        for collector in host_collectors(host_ref):
            r.register(collector)
        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}

    def child(self, metric: Any, *values: str) -> Any:
        """``metric.labels(*values)`` (``metric``: one of this object's families),
        looked up once per label set and then kept: ``labels`` validates and locks on
        every call, and the request path asks for about ten children per request (a
        profiled cost, docs/performance.md, issue 38 item 2). Label sets are never
        removed from these families, so a kept child stays the exported one; the cache
        holds as many entries as the families hold series."""
        key = (id(metric), values)
        found = self._children.get(key)
        if found is None:
            found = self._children[key] = metric.labels(*values)
        return found

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
