"""How the API opens a request's state (:mod:`servehall.api.intake`): the listeners that
report it (trace only when traced; record; canary guard), the principal, the version pin
header, a batch line's call, and how a request ends on an error."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from starlette.types import Message

from servehall import Policy, Principal
from servehall.api.app import create_app
from servehall.api.intake import end_request, end_with_error, open_state
from servehall.api.state import ApiState
from servehall.api.tracing import RequestTrace, Tracing
from servehall.batches.call import SCOPE_KEY, BatchCall
from servehall.config.models import TracingSettings
from servehall.config.settings import Settings
from servehall.errors import InvalidRequestError
from servehall.plugin.host import Host
from servehall.plugin.manager import PluginHost
from servehall.rollout.guard import GuardListener
from servehall.serving.request import RecordEmitter

_SPAN_KEY = "servehall.trace_span"  # where TracingMiddleware keeps the server span


class Bus:
    def __init__(self) -> None:
        self.records: list[Any] = []

    def emit(self, record: Any) -> None:
        self.records.append(record)


def _api(tracing: Tracing | None = None) -> ApiState:
    host = Host(settings=Settings(), plugins=PluginHost([]))
    host.records = Bus()
    api: ApiState = create_app(host, tracing=tracing).state.api
    return api


def _scope(**extra: Any) -> dict[str, Any]:
    return {
        "type": "http",
        "path": "/v1/completions",
        "headers": [(b"x-servehall-model-version", b"v2")],
        "client": ("10.0.0.7", 5000),
        **extra,
    }


def test_an_untraced_request_reports_its_record_and_to_the_guard() -> None:
    state = open_state(_api(), _scope(), "cmpl-1", "/v1/completions")
    assert [type(x) for x in state.listeners] == [RecordEmitter, GuardListener]
    assert state.pinned_version == "v2"
    assert state.record.client_addr == "10.0.0.7"
    assert state.principal.id == "anonymous"
    assert state.batch_priority is None and state.record.batch_id is None


def test_a_traced_request_ends_its_trace_first_and_emits_in_a_record_span() -> None:
    exporter = InMemorySpanExporter()
    tracing = Tracing.from_settings(TracingSettings(), exporter=exporter)
    assert tracing is not None
    api = _api(tracing)
    span = tracing.tracer.start_span("text_completion")
    state = open_state(api, _scope(state={_SPAN_KEY: span}), "cmpl-1", "/v1/completions")
    assert [type(x) for x in state.listeners] == [RequestTrace, RecordEmitter, GuardListener]
    state.finish(400, error_code="invalid_request_error")
    span.end()
    tracing.provider.force_flush()
    spans = exporter.get_finished_spans()
    assert [s.name for s in spans] == ["record", "text_completion"]
    assert dict(spans[1].attributes or {})["http.response.status_code"] == 400
    assert [r.status_code for r in api.host.records.records] == [400]


def test_principal_and_batch_call_come_from_the_scope() -> None:
    who = Principal(id="k1", tenant="t1", policy=Policy())
    call = BatchCall(principal=who, batch_id="batch_1", custom_id="line-3", priority=-5)
    state = open_state(
        _api(), _scope(state={"principal": who}, **{SCOPE_KEY: call}), "chatcmpl-1", "/x"
    )
    assert state.principal is who and state.record.tenant == "t1"
    assert state.batch_priority == -5
    assert (state.record.batch_id, state.record.custom_id) == ("batch_1", "line-3")


def test_end_request_leaves_one_record_of_a_cancelled_request() -> None:
    api = _api()
    state = open_state(api, _scope(), "cmpl-1", "/v1/completions")
    end_request(state)
    end_request(state)
    rec = api.host.records.records
    assert [(r.status_code, r.error_code) for r in rec] == [(499, "cancelled")]


async def _nothing() -> Message:
    return {"type": "http.disconnect"}


async def test_end_with_error_answers_and_records(caplog: pytest.LogCaptureFixture) -> None:
    api = _api()
    sent: list[Message] = []

    async def send(message: Message) -> None:
        sent.append(message)

    state = open_state(api, _scope(), "cmpl-1", "/v1/completions")
    bad = InvalidRequestError("no", param="n")
    await end_with_error(state, bad, _scope(), _nothing, send)
    assert sent[0]["status"] == 400 and (b"x-request-id", b"cmpl-1") in sent[0]["headers"]
    assert json.loads(sent[1]["body"])["error"]["param"] == "n"

    sent.clear()
    state = open_state(api, _scope(), "cmpl-2", "/v1/completions")
    with caplog.at_level(logging.ERROR, logger="servehall.api"):
        await end_with_error(state, RuntimeError("boom"), _scope(), _nothing, send)
    assert sent[0]["status"] == 500
    assert json.loads(sent[1]["body"])["error"]["message"] == (
        "The server had an error processing the request."
    )
    assert "request cmpl-2 failed" in caplog.text and "RuntimeError: boom" in caplog.text

    sent.clear()
    state = open_state(api, _scope(), "cmpl-3", "/v1/completions")
    state.response_started = True  # too late to answer: only the record
    await end_with_error(state, RuntimeError("late"), _scope(), _nothing, send)
    assert sent == []
    records = api.host.records.records
    assert [(r.status_code, r.error_code) for r in records] == [
        (400, None),  # the code the error carries (none here)
        (500, "server_error"),
        (500, "server_error"),
    ]
