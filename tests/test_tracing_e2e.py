"""Traces from a real ``servehall serve`` reach a real OTLP/HTTP receiver: a tiny HTTP
server started by the test collects the exporter's protobuf POSTs on ``/v1/traces`` and
decodes them with ``opentelemetry-proto``. The caller's ``traceparent`` is the parent of
the server span; the request's spans arrive with their GenAI attributes."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from tests.conftest import ServerHandle, demo_config

TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
PARENT_ID = "b7ad6b7169203331"


class _Receiver(BaseHTTPRequestHandler):
    posts: list[tuple[str, str, bytes]]

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("content-length", "0")))
        self.server.posts.append(  # type: ignore[attr-defined]
            (self.path, self.headers.get("content-type", ""), body)
        )
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def receiver() -> Iterator[ThreadingHTTPServer]:
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Receiver)
    srv.posts = []  # type: ignore[attr-defined]
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield srv
    srv.shutdown()


def _spans(receiver: ThreadingHTTPServer) -> list[Any]:
    out = []
    for path, ctype, body in list(receiver.posts):  # type: ignore[attr-defined]
        assert path == "/v1/traces" and ctype == "application/x-protobuf"
        req = ExportTraceServiceRequest()
        req.ParseFromString(body)
        for rs in req.resource_spans:
            service = {a.key: a.value.string_value for a in rs.resource.attributes}
            assert service["service.name"] == "servehall-e2e"
            for ss in rs.scope_spans:
                out.extend(ss.spans)
    return out


def test_spans_reach_an_otlp_http_receiver(
    servehall_server: Callable[..., ServerHandle],
    demo_model_dir: Path,
    receiver: ThreadingHTTPServer,
) -> None:
    port = receiver.server_address[1]
    cfg = demo_config(
        demo_model_dir,
        tracing={
            "enabled": True,
            "endpoint": f"http://127.0.0.1:{port}/v1/traces",
            "service_name": "servehall-e2e",
        },
    )
    srv = servehall_server(cfg, name="tracing", ready_timeout=600)
    with httpx.Client(base_url=srv.base_url, timeout=120) as c:
        r = c.post(
            "/v1/completions",
            json={"model": "demo", "prompt": "hello", "max_tokens": 4},
            headers={"traceparent": f"00-{TRACE_ID}-{PARENT_ID}-01"},
        )
        assert r.status_code == 200, r.text
        assert r.headers["traceresponse"].startswith(f"00-{TRACE_ID}-")
    deadline = time.monotonic() + 30  # the batch processor exports every 5 s
    while time.monotonic() < deadline and len(_spans(receiver)) < 5:
        time.sleep(0.2)
    spans = {s.name: s for s in _spans(receiver) if s.trace_id.hex() == TRACE_ID}
    assert set(spans) == {"text_completion demo", "admission", "prefill", "decode", "record"}
    server = spans["text_completion demo"]
    assert server.parent_span_id.hex() == PARENT_ID
    for name in ("admission", "prefill", "decode", "record"):
        assert spans[name].parent_span_id == server.span_id, name
    attrs = {a.key: a.value for a in server.attributes}
    assert attrs["gen_ai.operation.name"].string_value == "text_completion"
    assert attrs["gen_ai.request.model"].string_value == "demo"
    assert attrs["gen_ai.usage.output_tokens"].int_value == r.json()["usage"]["completion_tokens"]
    assert attrs["http.response.status_code"].int_value == 200
    assert "gen_ai.usage.input_tokens" in attrs
