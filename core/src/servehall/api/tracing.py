"""OpenTelemetry traces of inference requests (``[tracing]``, off by default).

One trace per request: a ``SERVER`` span named ``"{gen_ai.operation.name} {model}"``
(``chat demo``, ``text_completion demo``) whose parent is the caller's W3C ``traceparent``
when it sends one (W3C Trace Context; the answer carries a ``traceresponse`` header with
the server span's ids, Trace Context Level 2), with child spans:

* ``auth`` — the authentication plugins (only when one is enabled);
* ``filters`` — the input filters (only when one is enabled);
* ``admission`` — authorize (quotas) and the wait for a scheduler slot (queue);
* ``prefill`` — from admission to the first token, and ``decode`` — first to last token
  (drawn afterwards from the request's timestamps; none when no token came);
* ``record`` — building and emitting the request record.

Attributes follow the OpenTelemetry GenAI semantic conventions (``gen_ai.operation.name``,
``gen_ai.provider.name`` = ``servehall``, ``gen_ai.request.model``,
``gen_ai.request.max_tokens``/``temperature``/``top_p``, ``gen_ai.response.id``,
``gen_ai.response.model``, ``gen_ai.response.finish_reasons``,
``gen_ai.usage.input_tokens``/``output_tokens``) plus HTTP ones
(``http.request.method``, ``url.path``, ``http.response.status_code``, ``error.type`` =
the OpenAI error code) and ``servehall.*`` ones (backend, tenant, queue time). No prompt or
completion text is ever put on a span.

Spans go through a ``BatchSpanProcessor`` to an OTLP/HTTP (protobuf) exporter; the SDK is
imported only when tracing is enabled (the ``tracing`` extra). Tests pass their own span
exporter (the SDK's ``InMemorySpanExporter``).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from servehall.errors import ConfigError

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter
    from opentelemetry.trace import Span, Tracer
    from starlette.types import ASGIApp, Message, Receive, Scope, Send

    from servehall.config.models import TracingSettings
    from servehall.serving.request import RequestState

OPERATIONS = {
    "/v1/chat/completions": "chat",
    "/v1/completions": "text_completion",
    "/v1/responses": "chat",
}
"""``gen_ai.operation.name`` of each traced path."""

_SCOPE_KEY = "servehall.trace_span"


class Tracing:
    """A tracer provider and the tracer the request path uses.

    Build with :meth:`from_settings`; :meth:`span` opens a child span of the current one
    (a no-op context when tracing is off, so call sites need no check).
    """

    def __init__(self, provider: TracerProvider) -> None:
        self.provider = provider
        self.tracer: Tracer = provider.get_tracer("servehall")

    @classmethod
    def from_settings(
        cls, settings: TracingSettings, exporter: SpanExporter | None = None
    ) -> Tracing | None:
        """The tracing of ``[tracing]`` (None when ``enabled`` is false and no
        ``exporter`` is given). ``exporter`` replaces the OTLP/HTTP exporter and is
        flushed synchronously (tests).

        Raises:
            ConfigError: tracing is enabled but ``opentelemetry-sdk`` or the OTLP/HTTP
                exporter is not installed.
        """
        if not settings.enabled and exporter is None:
            return None
        try:
            from opentelemetry.sdk.resources import Resource
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
            from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
        except ImportError as exc:  # pragma: no cover - depends on the install
            raise ConfigError(
                "[tracing] enabled = true needs the tracing extra: pip install 'servehall[tracing]'"
            ) from exc
        provider = TracerProvider(
            resource=Resource.create({"service.name": settings.service_name}),
            sampler=ParentBased(TraceIdRatioBased(settings.sample_ratio)),
        )
        if exporter is not None:
            provider.add_span_processor(SimpleSpanProcessor(exporter))
        else:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            otlp = OTLPSpanExporter(
                endpoint=settings.endpoint,
                headers={k: v.get_secret_value() for k, v in settings.headers.items()},
                timeout=settings.export_timeout_s,
            )
            provider.add_span_processor(BatchSpanProcessor(otlp))
        return cls(provider)

    @contextlib.contextmanager
    def span(self, name: str, **attributes: Any) -> Iterator[Span]:
        """A child span of the current span, current while the block runs."""
        with self.tracer.start_as_current_span(name, attributes=_attrs(attributes)) as s:
            yield s

    def spans_between(self, parent: Span, spans: list[tuple[str, float, float]]) -> None:
        """Finished child spans of ``parent``, each ``(name, start_s, end_s)`` in
        monotonic seconds (converted to wall-clock nanoseconds with one offset, so that
        spans that touch in monotonic time touch in the trace)."""
        from opentelemetry import trace

        offset = time.time_ns() - int(time.monotonic() * 1e9)
        context = trace.set_span_in_context(parent)
        for name, start_s, end_s in spans:
            span = self.tracer.start_span(
                name, context=context, start_time=int(start_s * 1e9) + offset
            )
            span.end(end_time=int(end_s * 1e9) + offset)

    def shutdown(self) -> None:
        """Flush and stop the exporter (server shutdown)."""
        self.provider.shutdown()


def _attrs(attributes: Mapping[str, Any]) -> dict[str, Any]:
    return {k.replace("__", "."): v for k, v in attributes.items() if v is not None}


def request_span(scope: Scope) -> Span | None:
    """The server span of the request in ``scope`` (None when not traced)."""
    return scope.get("state", {}).get(_SCOPE_KEY)


@contextlib.contextmanager
def maybe_span(tracing: Tracing | None, name: str, **attributes: Any) -> Iterator[None]:
    """:meth:`Tracing.span` when ``tracing`` is set, else nothing."""
    if tracing is None:
        yield
        return
    with tracing.span(name, **attributes):
        yield


class RequestTrace:
    """The listener (:class:`~servehall.serving.request.RequestListener`) that ends a
    request's trace: the request's facts as attributes of ``span`` (its server span),
    and its ``prefill``/``decode`` spans drawn from its timestamps."""

    def __init__(self, tracing: Tracing, span: Span) -> None:
        self.tracing = tracing
        self.span = span

    def ended(self, state: RequestState, now: float) -> None:
        """Set the ended request's attributes and draw its phase spans."""
        span, rec = self.span, state.record
        if rec.model:
            span.update_name(f"{span.name} {rec.model}")  # type: ignore[attr-defined,unused-ignore]
        attrs: dict[str, Any] = {
            **state.request_attrs,
            "http.response.status_code": rec.status_code,
            "gen_ai.response.id": rec.request_id,
            "gen_ai.request.model": rec.model,
            "gen_ai.response.model": rec.model if rec.status_code == 200 else None,
            "gen_ai.usage.input_tokens": rec.prompt_tokens if state.admitted else None,
            "gen_ai.usage.output_tokens": rec.completion_tokens if state.admitted else None,
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
        first, admitted = state.first_token_at, state.admitted_at
        if admitted is not None:
            phases = [("prefill", admitted, first or now)]
            if first is not None:
                phases.append(("decode", first, now))
            self.tracing.spans_between(span, phases)


class TracingMiddleware:
    """ASGI middleware: a server span around each inference request (module docstring).

    Reads ``traceparent``/``tracestate`` with the W3C propagator, makes the span current
    for the request's task (child spans and tasks created from it inherit it), stores it
    in ``scope["state"]`` for the request path, and adds ``traceresponse`` to the answer.
    """

    def __init__(self, app: ASGIApp, tracing: Tracing) -> None:
        self.app = app
        self.tracing = tracing

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        operation = OPERATIONS.get(scope.get("path", "")) if scope["type"] == "http" else None
        if operation is None:
            await self.app(scope, receive, send)
            return
        from opentelemetry import trace
        from opentelemetry.trace import SpanKind
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        carrier = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        parent = TraceContextTextMapPropagator().extract(carrier)
        span = self.tracing.tracer.start_span(
            operation,
            context=parent,
            kind=SpanKind.SERVER,
            attributes={
                "gen_ai.operation.name": operation,
                "gen_ai.provider.name": "servehall",
                "http.request.method": scope.get("method", ""),
                "url.path": scope.get("path", ""),
            },
        )
        scope.setdefault("state", {})[_SCOPE_KEY] = span
        sc = span.get_span_context()
        response = f"00-{sc.trace_id:032x}-{sc.span_id:016x}-{int(sc.trace_flags):02x}"

        async def send_with_header(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                headers.append((b"traceresponse", response.encode("ascii")))
                message = {**message, "headers": headers}
            await send(message)

        with trace.use_span(span, end_on_exit=True, record_exception=False):
            await self.app(scope, receive, send_with_header)
