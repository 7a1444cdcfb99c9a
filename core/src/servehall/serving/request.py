"""The state of one request while it runs (:class:`RequestState`): who asked, the model
version it runs on, its choices, its prompt's text and token count, filter verdicts, and
the one :class:`~servehall.records.RequestRecord` and metrics it ends with.

It is the one per-request object of the request path: the API endpoints fill it, the
response writers read it, and :meth:`RequestState.finish` turns it into the record.
``finish`` is idempotent: the first call completes the record from the state (token
counts, the first token's time, inter-token gaps, verdicts, the tools called), emits it
through ``host.records.emit`` and updates metrics; later calls do nothing. The request
path calls it in a ``finally`` so every outcome — success, validation error, auth
failure, overload, client disconnect — produces exactly one record.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from servehall.admission.principal import ANONYMOUS, Principal
from servehall.metrics import ABORT_REASONS, TENANT_REFUSALS
from servehall.plugin.host import model_key
from servehall.records.types import RequestRecord
from servehall.rollout.guard import observe

if TYPE_CHECKING:
    from opentelemetry.trace import Span

    from servehall.admission.filters import FilterVerdict
    from servehall.api.tracing import Tracing
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


class RequestState:
    """Facts gathered while one request runs (see the module docstring).

    ``created`` is the OpenAI ``created`` time (Unix seconds); ``choices`` holds one
    :class:`~servehall.serving.choice.ChoiceStream` per choice once the request is
    admitted (``n`` of them); ``prompt_tokens`` counts the rendered prompt's token ids;
    ``response_started`` turns true once the response's status line left;
    ``pinned_version`` is the ``x-servehall-model-version`` request header (None:
    absent); ``served`` is the model version chosen for the request (None: not yet);
    ``structured`` is the request's structured-output constraint (None: none).
    """

    def __init__(
        self,
        host: Host,
        metrics: Metrics | None,
        request_id: str,
        endpoint: str,
        client_addr: str | None,
    ) -> None:
        self.host = host
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
        self._done = False
        self._tracing: Tracing | None = None
        self._span: Span | None = None
        self._request_attrs: dict[str, Any] = {}

    def trace(self, tracing: Tracing | None, span: Span | None) -> None:
        """Trace this request on ``span`` (the server span of
        :class:`~servehall.api.tracing.TracingMiddleware`); no-op when either is None."""
        if tracing is not None and span is not None:
            self._tracing, self._span = tracing, span

    def request_params(
        self, max_tokens: int, temperature: float | None, top_p: float | None
    ) -> None:
        """Note the sampling parameters for the trace (GenAI ``gen_ai.request.*``)."""
        if self._span is not None:
            self._request_attrs = {
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
        if self._tracing is not None and self._span is not None:
            self._end_trace(now)
            with self._tracing.span("record"):
                self._emit()
        else:
            self._emit()
        self._observe(now)

    def _emit(self) -> None:
        records = self.host.records
        if records is not None:
            try:
                records.emit(dataclasses.replace(self.record))
            except Exception:  # the bus must never break a response
                log.exception("record bus rejected a request record")

    def _end_trace(self, now: float) -> None:
        """The request's facts as span attributes, and its prefill/decode spans."""
        assert self._tracing is not None and self._span is not None
        span, rec = self._span, self.record
        if rec.model:
            span.update_name(f"{span.name} {rec.model}")  # type: ignore[attr-defined,unused-ignore]
        attrs: dict[str, Any] = {
            **self._request_attrs,
            "http.response.status_code": rec.status_code,
            "gen_ai.response.id": rec.request_id,
            "gen_ai.request.model": rec.model,
            "gen_ai.response.model": rec.model if rec.status_code == 200 else None,
            "gen_ai.usage.input_tokens": rec.prompt_tokens if self.admitted else None,
            "gen_ai.usage.output_tokens": rec.completion_tokens if self.admitted else None,
            "gen_ai.response.finish_reasons": [rec.finish_reason] if rec.finish_reason else None,
            "error.type": rec.error_code,
            "servehall.backend": rec.backend,
            "servehall.tenant": rec.tenant,
            "servehall.queue_time_s": rec.queue_time_s,
        }
        span.set_attributes({k: v for k, v in attrs.items() if v is not None})
        if rec.status_code is not None and rec.status_code >= 500:
            from opentelemetry.trace import Status, StatusCode

            span.set_status(Status(StatusCode.ERROR, rec.error_code or "server error"))
        first, admitted = self.first_token_at, self.admitted_at
        if admitted is not None:
            phases = [("prefill", admitted, first or now)]
            if first is not None:
                phases.append(("decode", first, now))
            self._tracing.spans_between(span, phases)

    def _observe(self, now: float) -> None:
        m = self.metrics
        rec = self.record
        if self.served is not None:
            # the canary guard sees every outcome of a version's traffic, refusals before
            # admission (queue full or timeout, records unavailable) included
            error = rec.status_code >= 500 or rec.finish_reason == "error"
            observe(self.host, m, self.served, error, rec.ttft_s)
        if m is None:
            return
        # only configured model names become label values (no unbounded cardinality)
        version = rec.version or ""
        served = self.host.models.get(model_key(rec.model, version)) if rec.model else None
        known = served is not None
        model = rec.model or "" if known else ""
        version = version if known else ""
        endpoint = rec.endpoint if rec.endpoint in KNOWN_ENDPOINTS else "other"
        m.requests.labels(model, version, endpoint, str(rec.status_code)).inc()
        if rec.tenant is not None and rec.status_code in TENANT_REFUSALS:
            m.tenant_refusals.labels(rec.tenant, str(rec.status_code)).inc()
        if rec.status_code >= 400:
            code = rec.error_code or "none"
            m.request_errors.labels(model, version, endpoint, str(rec.status_code), code).inc()
        if rec.response_format is not None and self.structured_outcome is not None:
            m.structured.labels(model, version, rec.response_format, self.structured_outcome).inc()
        if not self.admitted:
            return
        m.e2e.labels(model, version).observe(now - self.started)
        if rec.queue_time_s is not None:
            m.queue.labels(model, version).observe(rec.queue_time_s)
        m.prompt_tokens.labels(model, version).inc(rec.prompt_tokens)
        m.generation_tokens.labels(model, version).inc(rec.completion_tokens)
        if rec.ttft_s is not None:
            m.ttft.labels(model, version).observe(rec.ttft_s)
            if rec.completion_tokens > 1 and self.first_token_at is not None:
                m.tpot.labels(model, version).observe(
                    (now - self.first_token_at) / (rec.completion_tokens - 1)
                )
        if self.inter_token_s:
            itl = m.itl.labels(model, version)
            for gap in self.inter_token_s:
                itl.observe(gap)
        if rec.finish_reason in ABORT_REASONS:
            m.aborts.labels(model, version, rec.finish_reason).inc()
