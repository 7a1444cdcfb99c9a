"""``servehall.api.access_log``: one line per HTTP request, without the query string,
headers or body, through a real Starlette app."""

from __future__ import annotations

import logging

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from servehall.admission.principal import Principal
from servehall.api.access_log import MAX_PATH_CHARS, AccessLogMiddleware


async def _hello(request: Request) -> PlainTextResponse:
    request.state.principal = Principal(id="sh-abc")
    return PlainTextResponse("hello", headers={"x-request-id": "chatcmpl-1"})


async def _anon(request: Request) -> PlainTextResponse:
    request.state.principal = Principal(id="anonymous", kind="anonymous")
    return PlainTextResponse("")


async def _boom(request: Request) -> PlainTextResponse:
    raise RuntimeError("boom")


def _client() -> httpx.AsyncClient:
    app = Starlette(
        routes=[
            Route("/hello", _hello, methods=["POST"]),
            Route("/anon", _anon),
            Route("/boom", _boom),
        ]
    )
    transport = httpx.ASGITransport(
        app=AccessLogMiddleware(app), raise_app_exceptions=False, client=("10.0.0.7", 5555)
    )
    return httpx.AsyncClient(transport=transport, base_url="http://t")


def _lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "servehall.access"]


async def test_one_line_with_status_bytes_id_and_principal(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="servehall.access")
    async with _client() as c:
        r = await c.post(
            "/hello?api_key=SECRET",
            headers={"Authorization": "Bearer SECRET"},
            content=b"prompt SECRET",
        )
    assert r.status_code == 200
    (line,) = _lines(caplog)
    assert line.startswith('10.0.0.7 "POST /hello HTTP/1.1" 200 5B ')
    assert line.endswith("ms id=chatcmpl-1 principal=sh-abc")
    assert "SECRET" not in line


async def test_anonymous_and_unknown_routes_show_dashes(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="servehall.access")
    async with _client() as c:
        await c.get("/anon")
        await c.get("/nowhere")
    anon, missing = _lines(caplog)
    assert anon.endswith("id=- principal=-") and '"GET /anon HTTP/1.1" 200 0B' in anon
    assert '"GET /nowhere HTTP/1.1" 404 ' in missing


async def test_a_failing_app_is_still_logged(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="servehall.access")
    async with _client() as c:
        r = await c.get("/boom")
    assert r.status_code == 500
    assert any('"GET /boom HTTP/1.1"' in line for line in _lines(caplog))


async def test_paths_are_printable_and_cut(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="servehall.access")
    async with _client() as c:
        await c.get('/a"b%01' + "x" * 400)
    (line,) = _lines(caplog)
    path = line.split('"')[1].split(" ")[1]
    assert path.startswith("/a?b?") and len(path) == MAX_PATH_CHARS and path.endswith("…")


async def test_nothing_is_logged_below_info(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="servehall.access")
    async with _client() as c:
        await c.get("/anon")
    assert _lines(caplog) == []
