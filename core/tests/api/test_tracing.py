"""OpenTelemetry traces of the request path, asserted span by span with the SDK's
in-memory exporter (the app in process, a scripted engine; tests/test_tracing_e2e.py
exports to a real OTLP/HTTP receiver from a real server)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

sys.path.insert(0, str(Path(__file__).parents[1]))
from api_fixtures import ScriptedEngine, make_host
from text_fixtures import build_tokenizer

from servehall import FilterVerdict, Policy, Principal, hookimpl
from servehall.api.app import create_app
from servehall.api.tracing import Tracing
from servehall.config.models import TracingSettings
from servehall.errors import AuthenticationError
from servehall.text import load_tokenizer

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT_ID}-01"


class Auth:
    @hookimpl
    def servehall_authenticate(self, request: Any) -> Principal | None:
        if request.headers.get("authorization") == "Bearer good":
            return Principal(id="k1", tenant="t1", policy=Policy(models=frozenset({"m"})))
        raise AuthenticationError()


class Filter:
    @hookimpl
    def servehall_input_filters(self) -> list[Any]:
        class F:
            name = "t"

            def check(self, prompt: Any) -> list[FilterVerdict]:
                return []

        return [F()]


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tokenizer(tmp_path_factory.mktemp("tok"))


def _traced(tok_dir: Path) -> tuple[httpx.AsyncClient, InMemorySpanExporter]:
    script = load_tokenizer(tok_dir).encode_plain(" the quick brown fox jumps over")
    host = make_host(
        tok_dir, ScriptedEngine(script), plugins=[("auth", Auth()), ("filter", Filter())]
    )
    exporter = InMemorySpanExporter()
    tracing = Tracing.from_settings(TracingSettings(), exporter=exporter)
    app = create_app(host, tracing=tracing)
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t")
    return client, exporter


def _by_name(spans: tuple[ReadableSpan, ...]) -> dict[str, ReadableSpan]:
    return {s.name: s for s in spans}


async def test_a_request_is_one_trace_under_the_callers_traceparent(tok_dir: Path) -> None:
    client, exporter = _traced(tok_dir)
    async with client as c:
        r = await c.post(
            "/v1/chat/completions",
            json={
                "model": "m",
                "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 4,
                "temperature": 0.5,
            },
            headers={"authorization": "Bearer good", "traceparent": TRACEPARENT},
        )
    assert r.status_code == 200, r.text
    spans = _by_name(exporter.get_finished_spans())
    assert set(spans) == {"chat m", "auth", "filters", "admission", "prefill", "decode", "record"}
    server = spans["chat m"]
    assert server.kind == SpanKind.SERVER
    assert server.context is not None and server.parent is not None
    assert f"{server.context.trace_id:032x}" == TRACE_ID
    assert f"{server.parent.span_id:016x}" == PARENT_ID and server.parent.is_remote
    for name in ("auth", "filters", "admission", "prefill", "decode", "record"):
        s = spans[name]
        assert s.context is not None and s.context.trace_id == server.context.trace_id
        assert s.parent is not None and s.parent.span_id == server.context.span_id, name
    # prefill ends where decode starts (the first token), both inside the server span
    assert spans["prefill"].end_time == spans["decode"].start_time
    assert server.start_time is not None and server.end_time is not None
    assert server.start_time <= spans["admission"].start_time  # type: ignore[operator]
    assert spans["decode"].end_time <= server.end_time  # type: ignore[operator]
    a = dict(server.attributes or {})
    assert a["gen_ai.operation.name"] == "chat"
    assert a["gen_ai.provider.name"] == "servehall"
    assert a["gen_ai.request.model"] == a["gen_ai.response.model"] == "m"
    assert a["gen_ai.request.max_tokens"] == 4 and a["gen_ai.request.temperature"] == 0.5
    assert a["gen_ai.response.id"] == r.json()["id"]
    assert a["gen_ai.usage.input_tokens"] == r.json()["usage"]["prompt_tokens"]
    assert a["gen_ai.usage.output_tokens"] == 4
    assert a["gen_ai.response.finish_reasons"] == ("length",)
    assert a["http.response.status_code"] == 200 and a["servehall.tenant"] == "t1"
    assert "hi" not in str(a)  # no prompt text on spans
    # the answer names the server span (W3C Trace Context Level 2 traceresponse)
    sc = server.context
    assert r.headers["traceresponse"] == f"00-{TRACE_ID}-{sc.span_id:016x}-01"


async def test_refusals_and_errors_are_traced(tok_dir: Path) -> None:
    client, exporter = _traced(tok_dir)
    async with client as c:
        r = await c.post(
            "/v1/completions",
            json={"model": "m", "prompt": "x"},
            headers={"authorization": "Bearer bad"},
        )
        assert r.status_code == 401
        r2 = await c.post(
            "/v1/completions",
            json={"model": "nope", "prompt": "x"},
            headers={"authorization": "Bearer good"},
        )
        assert r2.status_code == 404
        assert (await c.get("/v1/models", headers={"authorization": "Bearer good"})).is_success
    spans = exporter.get_finished_spans()
    names = [s.name for s in spans]
    # the refused one: auth failed (an exception event), no other child; not a new trace
    # per route: /v1/models is not traced
    assert names.count("auth") == 2 and "admission" not in names
    auth_fail = next(s for s in spans if s.name == "auth")
    assert auth_fail.status.status_code == StatusCode.ERROR
    assert names.count("record") == 2  # the 401 has its record too
    servers = [s for s in spans if s.kind == SpanKind.SERVER]
    assert [s.name for s in servers] == ["text_completion", "text_completion"]
    assert servers[1].attributes is not None
    assert servers[1].attributes["error.type"] == "model_not_found"
    assert servers[1].attributes["http.response.status_code"] == 404
    # without a traceparent each request starts its own trace
    assert servers[0].context is not None and servers[1].context is not None
    assert servers[0].context.trace_id != servers[1].context.trace_id
    assert servers[0].parent is None
    assert servers[0].attributes is not None
    assert servers[0].attributes["http.response.status_code"] == 401


def test_tracing_is_off_by_default() -> None:
    assert Tracing.from_settings(TracingSettings()) is None
