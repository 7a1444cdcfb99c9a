"""``servehall.api.inference.InferenceEndpoint`` on the real app (a scripted engine and
the test tokenizer): one request record per outcome — a completed request (and the
model marked ready), a refusal before any engine work, a client gone before its body
arrived (499), a client gone while generating (499, the engine request ended) — and
ids of the two routes' forms."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).parents[1]))
from api_fixtures import ScriptedEngine, make_host
from text_fixtures import build_tokenizer

from servehall.api.app import create_app
from servehall.api.inference import InferenceEndpoint
from servehall.api.intake import STATUS_CLIENT_CLOSED
from servehall.plugin.host import Host
from servehall.serving.probe import Readiness


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tokenizer(tmp_path_factory.mktemp("tok"))


def _host(tok_dir: Path, step_s: float = 0.0) -> tuple[Host, ScriptedEngine]:
    from servehall.text import load_tokenizer

    ids = load_tokenizer(tok_dir).encode_plain(" the quick brown fox")
    engine = ScriptedEngine(ids, step_s=step_s)
    return make_host(tok_dir, engine), engine


def _records(host: Host) -> list[Any]:
    return list(host.records.records)  # type: ignore[union-attr]


def test_route_forms() -> None:
    chat, text = InferenceEndpoint("chat"), InferenceEndpoint("completion")
    assert (chat.endpoint, chat.prefix) == ("/v1/chat/completions", "chatcmpl-")
    assert (text.endpoint, text.prefix) == ("/v1/completions", "cmpl-")


async def test_a_completed_request_is_recorded_and_marks_the_model_ready(tok_dir: Path) -> None:
    host, _ = _host(tok_dir)
    readiness = Readiness(host)
    app = create_app(host, readiness=readiness)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
        r = await c.post("/v1/completions", json={"model": "m", "prompt": "hi", "max_tokens": 3})
    assert r.status_code == 200
    body = r.json()
    assert body["id"].startswith("cmpl-") and r.headers["x-request-id"] == body["id"]
    [rec] = _records(host)
    assert (rec.request_id, rec.status_code, rec.finish_reason) == (body["id"], 200, "length")
    assert rec.completion_tokens == 3 and rec.prompt_tokens == body["usage"]["prompt_tokens"]
    assert "m" in readiness.last_ok


@pytest.mark.parametrize(
    ("headers", "content", "status"),
    [
        ({"content-type": "text/plain"}, b"{}", 415),
        ({"content-type": "application/json"}, b"{not json", 400),
        ({"content-type": "application/json"}, b'{"model": "nope", "prompt": "x"}', 404),
    ],
)
async def test_refusals_are_recorded(
    tok_dir: Path, headers: dict[str, str], content: bytes, status: int
) -> None:
    host, engine = _host(tok_dir)
    app = create_app(host)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
        r = await c.post("/v1/completions", headers=headers, content=content)
    assert r.status_code == status
    [rec] = _records(host)
    assert rec.status_code == status and rec.request_id == r.headers["x-request-id"]
    assert engine.prompts == []


async def _call(
    app: Any, messages: list[dict[str, Any]], gone: asyncio.Event | None = None
) -> list[dict[str, Any]]:
    """Run the app on one raw ASGI request: ``messages``, then ``http.disconnect`` once
    ``gone`` is set."""
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/v1/completions",
        "raw_path": b"/v1/completions",
        "query_string": b"",
        "root_path": "",
        "headers": [(b"host", b"t"), (b"content-type", b"application/json")],
        "client": ("127.0.0.1", 1),
        "server": ("t", 80),
    }
    queue: list[dict[str, Any]] = [*messages]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        if queue:
            return queue.pop(0)
        await (gone or asyncio.Event()).wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t"):
        await asyncio.wait_for(app(scope, receive, send), 10)
    return sent


async def test_a_client_gone_before_its_body_is_499(tok_dir: Path) -> None:
    host, engine = _host(tok_dir)
    sent = await _call(create_app(host), [{"type": "http.disconnect"}])
    assert sent == []
    [rec] = _records(host)
    assert rec.status_code == STATUS_CLIENT_CLOSED == 499
    assert rec.finish_reason == "client_disconnect" and engine.prompts == []


async def test_a_client_gone_while_generating_ends_the_engine_request(tok_dir: Path) -> None:
    host, engine = _host(tok_dir, step_s=0.05)
    body = b'{"model": "m", "prompt": "hi", "max_tokens": 50, "stream": true}'
    gone = asyncio.Event()
    messages = [{"type": "http.request", "body": body, "more_body": False}]
    task = asyncio.ensure_future(_call(create_app(host), messages, gone))
    for _ in range(200):
        await asyncio.sleep(0.01)
        if engine.live:
            break
    assert engine.live
    await asyncio.sleep(0.2)  # a few 50 ms steps reach the client
    gone.set()
    sent = await task
    assert sent[0]["status"] == 200  # the stream had started
    assert engine.live == set()  # the engine request ended with the client
    [rec] = _records(host)
    assert rec.status_code == 499 and rec.finish_reason == "client_disconnect"
    assert 0 < rec.completion_tokens < 50
