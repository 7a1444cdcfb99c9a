"""The state of one request while it runs (:class:`RequestState`): who asked, the model
version it runs on, its choices, its prompt's text and token count, filter verdicts, and
the one :class:`~servehall.records.RequestRecord` and metrics it ends with.

It is the one per-request object of the request path: the API endpoints fill it, the
response writers read it, and :meth:`RequestState.finish` turns it into the record.
``finish`` is idempotent: the first call completes the record from the state (token
counts, the first token's time, inter-token gaps, verdicts, the tools called), tells its
listeners (:class:`RequestListener`, in the order given) and updates metrics; later calls
do nothing. The request path calls it in a ``finally`` so every outcome — success,
validation error, auth failure, overload, client disconnect — produces exactly one record.

Reporting is handed in, not imported from above: the API opens each state
(:func:`servehall.api.opening.open_state`) with its listeners — the request's trace
(:class:`servehall.api.tracing.RequestTrace`), the record (:class:`RecordEmitter`, onto
``host.records``) and the canary guard (:class:`servehall.rollout.guard.GuardListener`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Protocol

from servehall.admission.principal import ANONYMOUS, Principal
from servehall.metrics import ABORT_REASONS, TENANT_REFUSALS, observe_all
from servehall.plugin.host import model_key
from servehall.records.types import RequestRecord

if TYPE_CHECKING:
    from servehall.admission.filters import FilterVerdict
    from servehall.metrics import Metrics
    from servehall.plugin.host import Host, ServedModel
    from servehall.serving.choice import ChoiceStream
    from servehall.structured.request import StructuredRequest

log = logging.getLogger("servehall.request")

KNOWN_ENDPOINTS = frozenset(
    {"/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses", "/v1/models"}
)
"""Endpoint label values; any other path is counted as ``other``."""


def verdict_dict(v: FilterVerdict) -> dict[str, Any]:
    """A verdict as the request log stores it."""
    return {
        "rule": v.rule,
        "action": v.action,
        "stage": v.stage,
        "count": v.count,
        "monitor": v.monitor,
    }


class RequestListener(Protocol):
    """Told once when a request ends: :meth:`ended` runs inside
    :meth:`RequestState.finish`, after the record is complete (``state.record``) and
    before the request metrics; ``now`` is the end's monotonic time (seconds)."""

    def ended(self, state: RequestState, now: float) -> None:
        """Report the ended request (must not raise)."""
        ...  # pragma: no cover - protocol


class RecordEmitter:
    """The listener that emits the request's record (a copy) on ``host.records``;
    ``around`` (e.g. a tracing span named ``record``) wraps the emit when given. A bus
    that rejects it is logged, never raised: the bus must never break a response."""

    def __init__(self, around: Callable[[], AbstractContextManager[Any]] | None = None) -> None:
        self.around = around

    def ended(self, state: RequestState, now: float) -> None:
        """Emit ``state.record`` (see the class docstring)."""
        records = state.host.records
        with self.around() if self.around is not None else contextlib.nullcontext():
            if records is not None:
                try:
                    records.emit(dataclasses.replace(state.record))
                except Exception:
                    log.exception("record bus rejected a request record")


class RequestState:
    """Facts gathered while one request runs (see the module docstring).

    ``created`` is the OpenAI ``created`` time (Unix seconds); ``choices`` holds one
    :class:`~servehall.serving.choice.ChoiceStream` per choice once the request is
    admitted (``n`` of them); ``prompt_tokens`` counts the rendered prompt's token ids;
    ``response_started`` turns true once the response's status line left;
    ``pinned_version`` is the ``x-servehall-model-version`` request header (None:
    absent); ``served`` is the model version chosen for the request (None: not yet);
    ``structured`` is the request's structured-output constraint (None: none);
    ``listeners`` report the request when it ends (:class:`RequestListener`);
    ``request_attrs`` are its sampling parameters as GenAI ``gen_ai.request.*``
    attributes (for a trace).
    """

    def __init__(
        self,
        host: Host,
        metrics: Metrics | None,
        request_id: str,
        endpoint: str,
        client_addr: str | None,
        listeners: Sequence[RequestListener] = (),
    ) -> None:
        self.host = host
        self.listeners: list[RequestListener] = list(listeners)
        self.metrics = metrics
        self.request_id = request_id
        self.started = time.monotonic()
        self.created = int(time.time())
        self.record = RequestRecord(
            request_id=request_id,
            received_at=datetime.now(UTC),
            endpoint=endpoint,
            client_addr=client_addr,
            replica=host.replica,
        )
        self.principal: Principal = ANONYMOUS
        self.pinned_version: str | None = None
        self.batch_priority: int | None = None  # a batch line's priority ceiling
        self.batch_call: Any = None  # a batch line's BatchCall (servehall.batches.call)
        self.served: ServedModel | None = None
        self.structured: StructuredRequest | None = None
        self.response_started = False
        self.choices: list[ChoiceStream] = []
        self.prompt_text = ""
        self.prompt_tokens = 0
        self.input_verdicts: list[FilterVerdict] = []
        self.verdicts: list[FilterVerdict] = []
        self.first_token_at: float | None = None
        self.inter_token_s: list[float] = []
        self.admitted = False
        self.admitted_at: float | None = None
        self.structured_outcome: str | None = None  # with record.response_format
        #: what a route built on the chat path (``/v1/responses``) keeps between steps
        self.route_data: Any = None
        self.request_attrs: dict[str, Any] = {}
        self._done = False

    def request_params(
        self, max_tokens: int, temperature: float | None, top_p: float | None
    ) -> None:
        """Note the sampling parameters for the trace (GenAI ``gen_ai.request.*``)."""
        self.request_attrs = {
            "gen_ai.request.max_tokens": max_tokens,
            "gen_ai.request.temperature": temperature,
            "gen_ai.request.top_p": top_p,
        }

    def set_principal(self, principal: Principal | None) -> None:
        """Who asks (the record's principal, tenant and prompt-storage policy)."""
        if principal is not None:
            self.principal = principal
            self.record.principal_id = principal.id
            self.record.tenant = principal.tenant
            self.record.store_prompts = principal.policy.store_prompts

    def token(self, at: float) -> None:
        """Note a first token at monotonic time ``at`` (the earliest one counts)."""
        if self.first_token_at is None or at < self.first_token_at:
            self.first_token_at = at

    def completion_text(self) -> str | None:
        """The first choice's text so far (what the record stores), or None before
        admission."""
        return self.choices[0].text if self.choices else None

    def usage(self) -> dict[str, int]:
        """The OpenAI ``usage`` object: prompt, completion (all choices) and total tokens."""
        completion = sum(c.completion_tokens for c in self.choices)
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": completion,
            "total_tokens": self.prompt_tokens + completion,
        }

    def count_tool_calls(self) -> None:
        """Add the request's parsed and failed tool calls to ``servehall_tool_calls_total``
        (once, when its choices have finished)."""
        if self.metrics is None:
            return
        model = self.record.model or ""
        version = self.record.version or ""
        counter = self.metrics.tool_calls
        for c in self.choices:
            if c.tools is not None:
                if c.tools.parsed:
                    counter.labels(model, version, "parsed").inc(c.tools.parsed)
                if c.tools.failed:
                    counter.labels(model, version, "failed").inc(c.tools.failed)

    async def record_before_last_byte(self) -> None:
        """With a sink that confirms writes (``[[sinks]] options.commit_wait_s``): finish
        the request's record (status 200) now and wait until it is written, so that the
        client receives the response's last bytes only once its request-log row is
        stored — a replica killed afterwards loses no record of a request its client saw
        complete. Without such a sink: nothing (the record is emitted after the response,
        as usual)."""
        bus = self.host.records
        if bus is None or not getattr(bus, "commit_wait", False):
            return
        self.finish(
            200,
            finish_reason=self.choices[0].finish_reason if self.choices else None,
            prompt_text=self.prompt_text,
            completion_text=self.completion_text(),
        )
        await bus.wait_written(self.record)

    def _gather(self) -> None:
        """Complete the record from the state: token counts, the first token's time
        (TTFT), the inter-token gaps, the filter verdicts and the names of the tools
        called."""
        rec = self.record
        rec.prompt_tokens = self.prompt_tokens
        if self.choices:
            rec.completion_tokens = sum(c.completion_tokens for c in self.choices)
            firsts = [c.first_token_at for c in self.choices if c.first_token_at is not None]
            if firsts:
                self.token(min(firsts))
            self.inter_token_s = [g for c in self.choices for g in c.inter_token_s]
        self.verdicts = [*self.input_verdicts, *(v for c in self.choices for v in c.verdicts)]
        if any(c.tools is not None for c in self.choices):
            rec.tool_calls = [call.name for c in self.choices for call in c.tool_calls]

    def finish(
        self,
        status: int,
        *,
        error_code: str | None = None,
        finish_reason: str | None = None,
        prompt_text: str | None = None,
        completion_text: str | None = None,
    ) -> None:
        """Complete the record from the state, emit it and the metrics once
        (idempotent)."""
        if self._done:
            return
        self._done = True
        self._gather()
        now = time.monotonic()
        rec = self.record
        rec.finished_at = datetime.now(UTC)
        rec.status_code = status
        if error_code is not None:
            rec.error_code = error_code
        if finish_reason is not None:
            rec.finish_reason = finish_reason
        rec.latency_s = now - self.started
        if self.first_token_at is not None:
            rec.ttft_s = self.first_token_at - self.started
        rec.filter_verdicts = [verdict_dict(v) for v in self.verdicts]
        keep = rec.store_prompts
        if keep is None:
            keep = self.host.settings.database.store_prompts
        if keep:
            rec.prompt_text = prompt_text
            rec.completion_text = completion_text
        for listener in self.listeners:
            listener.ended(self, now)
        self._observe(now)

    def _observe(self, now: float) -> None:
        m = self.metrics
        rec = self.record
        if m is None:
            return
        # only configured model names become label values (no unbounded cardinality)
        version = rec.version or ""
        served = self.host.models.get(model_key(rec.model, version)) if rec.model else None
        known = served is not None
        model = rec.model or "" if known else ""
        version = version if known else ""
        endpoint = rec.endpoint if rec.endpoint in KNOWN_ENDPOINTS else "other"
        m.child(m.requests, model, version, endpoint, str(rec.status_code)).inc()
        if rec.tenant is not None and rec.status_code in TENANT_REFUSALS:
            m.child(m.tenant_refusals, rec.tenant, str(rec.status_code)).inc()
        if rec.status_code >= 400:
            code = rec.error_code or "none"
            m.child(m.request_errors, model, version, endpoint, str(rec.status_code), code).inc()
        if rec.response_format is not None and self.structured_outcome is not None:
            m.child(
                m.structured, model, version, rec.response_format, self.structured_outcome
            ).inc()
        if not self.admitted:
            return
        m.child(m.e2e, model, version).observe(now - self.started)
        if rec.queue_time_s is not None:
            m.child(m.queue, model, version).observe(rec.queue_time_s)
        held = now - self.started - (rec.queue_time_s or 0.0)
        kind = "online" if self.batch_priority is None else "batch"
        m.child(m.slot_seconds, model, version, kind).inc(max(0.0, held))
        m.child(m.prompt_tokens, model, version).inc(rec.prompt_tokens)
        m.child(m.generation_tokens, model, version).inc(rec.completion_tokens)
        if rec.ttft_s is not None:
            m.child(m.ttft, model, version).observe(rec.ttft_s)
            if rec.completion_tokens > 1 and self.first_token_at is not None:
                m.child(m.tpot, model, version).observe(
                    (now - self.first_token_at) / (rec.completion_tokens - 1)
                )
        if self.inter_token_s:
            observe_all(m.child(m.itl, model, version), self.inter_token_s)
        if rec.finish_reason in ABORT_REASONS:
            m.child(m.aborts, model, version, rec.finish_reason).inc()
