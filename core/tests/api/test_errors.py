"""``servehall.api.errors``: every failure as a small OpenAI error envelope — a
ServehallError with its status and headers, an unknown route, a wrong method, anything
unexpected (a 500 without the trace) — through a real Starlette app."""

from __future__ import annotations

import json
import logging
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from servehall.api.errors import (
    MAX_MESSAGE_CHARS,
    error_response,
    install_handlers,
    plain_error,
)
from servehall.errors import InvalidRequestError, RateLimitError


def test_error_response_has_the_status_envelope_and_headers() -> None:
    exc = RateLimitError("slow down", headers={"Retry-After": "3"})
    resp = error_response(exc)
    assert resp.status_code == 429
    assert resp.headers["retry-after"] == "3" and "connection" not in resp.headers
    body = json.loads(bytes(resp.body))
    assert body["error"]["message"] == "slow down"
    assert error_response(exc, close=True).headers["connection"] == "close"


def test_a_long_message_is_cut() -> None:
    resp = error_response(InvalidRequestError("x" * (MAX_MESSAGE_CHARS * 2)))
    msg = json.loads(bytes(resp.body))["error"]["message"]
    assert len(msg) == MAX_MESSAGE_CHARS and msg.endswith("…")


def test_plain_error() -> None:
    resp = plain_error(418, "teapot", code="tea")
    assert resp.status_code == 418
    assert json.loads(bytes(resp.body)) == {
        "error": {
            "message": "teapot",
            "type": "invalid_request_error",
            "param": None,
            "code": "tea",
        }
    }


async def _raise_servehall(request: Request) -> PlainTextResponse:
    raise InvalidRequestError("bad field", param="n")


async def _raise_other(request: Request) -> PlainTextResponse:
    raise RuntimeError("secret internals /etc/x")


async def _ok(request: Request) -> PlainTextResponse:
    return PlainTextResponse("ok")


@pytest.fixture
def client() -> httpx.AsyncClient:
    app = Starlette(
        routes=[
            Route("/bad", _raise_servehall),
            Route("/boom", _raise_other),
            Route("/only-get", _ok, methods=["GET"]),
        ]
    )
    install_handlers(app)
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    return httpx.AsyncClient(transport=transport, base_url="http://t")


async def test_a_servehall_error_is_its_envelope(client: httpx.AsyncClient) -> None:
    r = await client.get("/bad")
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "n" and r.json()["error"]["message"] == "bad field"


async def test_an_unknown_route_is_a_404_envelope(client: httpx.AsyncClient) -> None:
    r = await client.get("/nowhere")
    assert r.status_code == 404
    assert r.json()["error"]["code"] == "not_found"


async def test_a_wrong_method_is_a_405_envelope(client: httpx.AsyncClient) -> None:
    r = await client.post("/only-get")
    assert r.status_code == 405
    assert "GET" in r.headers["allow"]  # the route's own headers are kept
    assert r.json()["error"] == {
        "message": "Method POST is not allowed on this route.",
        "type": "invalid_request_error",
        "param": None,
        "code": "method_not_allowed",
    }


async def test_anything_else_is_a_500_without_the_trace(
    client: httpx.AsyncClient, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.ERROR, logger="servehall.api"):
        r = await client.get("/boom")
    assert r.status_code == 500
    assert "secret internals" not in r.text
    assert r.json()["error"]["message"] == "The server had an error processing the request."
    assert "unhandled error on GET /boom" in caplog.text


@pytest.mark.parametrize(
    ("body", "message"),
    [
        # a list was sent: the list branch says what is wrong, not "a valid string"
        ({"stop": [""]}, "Invalid request: stop[0]: String should have at least 1 character"),
        (
            {"messages": [{"role": "user", "content": []}]},
            "Invalid request: messages[0].user.content: List should have at least 1 item",
        ),
        # no branch takes the input's type: every branch's type is named
        ({"stop": 5}, "Invalid request: stop: Input should be a valid string or a valid list"),
        (
            {"messages": [{"role": "user", "content": 5}]},
            "Invalid request: messages[0].user.content: Input should be a valid string or a "
            "valid list",
        ),
    ],
)
def test_union_errors_name_the_branch_the_input_is_for(body: dict[str, Any], message: str) -> None:
    from pydantic import ValidationError

    from servehall.api.errors import from_validation_error
    from servehall.api.wire import ChatCompletionRequest

    full = {"model": "m", "messages": [{"role": "user", "content": "x"}]} | body
    with pytest.raises(ValidationError) as err:
        ChatCompletionRequest.model_validate(full)
    got = from_validation_error(err.value)
    assert got.message.startswith(message), got.message
    assert got.param == next(iter(body))
    assert got.message.count("valid string") <= 1
