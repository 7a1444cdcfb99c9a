"""``servehall.batches.lines``: OpenAI's batch output and error-file lines."""

from __future__ import annotations

import json
from typing import Any

import pytest

from servehall.batches.lines import (
    EXPIRED_CODE,
    EXPIRED_MESSAGE,
    error_of,
    expired_line,
    response_line,
    unrun_line,
)


@pytest.mark.parametrize("status", [200, 201, 299])
def test_a_2xx_has_no_error(status: int) -> None:
    assert error_of(status, {"error": {"code": "x", "message": "y"}}) is None


def test_the_error_is_the_envelopes_code_and_message() -> None:
    body = {"error": {"code": "model_not_found", "type": "invalid_request_error", "message": "no"}}
    assert error_of(404, body) == {"code": "model_not_found", "message": "no"}


def test_an_envelope_without_a_code_gives_its_type_then_the_status() -> None:
    assert error_of(429, {"error": {"type": "rate_limit", "message": "m"}}) == {
        "code": "rate_limit",
        "message": "m",
    }
    assert error_of(500, {"error": {"message": None}}) == {"code": "http_500", "message": ""}


@pytest.mark.parametrize("body", [None, "text", [1], {"detail": "x"}, {"error": "flat"}])
def test_a_body_that_is_no_envelope_gives_the_status(body: Any) -> None:
    assert error_of(502, body) == {"code": "http_502", "message": "The request failed (502)."}


def test_a_response_line_is_compact_json_with_a_fresh_id() -> None:
    line = response_line("c-1", 200, "chatcmpl-1", {"ok": "é"})
    assert "\n" not in line and ", " not in line and "é" in line
    data = json.loads(line)
    assert data["id"].startswith("batch_req_") and len(data["id"]) == len("batch_req_") + 32
    assert data == {
        "id": data["id"],
        "custom_id": "c-1",
        "response": {"status_code": 200, "request_id": "chatcmpl-1", "body": {"ok": "é"}},
        "error": None,
    }
    assert json.loads(response_line("c-1", 200, None, {}))["id"] != data["id"]


def test_a_failed_response_line_carries_the_body_and_the_error() -> None:
    body = {"error": {"code": "context_length_exceeded", "message": "too long"}}
    data = json.loads(response_line("c-2", 400, "r", body))
    assert data["response"]["body"] == body
    assert data["error"] == {"code": "context_length_exceeded", "message": "too long"}


def test_lines_that_never_ran_have_no_response() -> None:
    data = json.loads(unrun_line("c-3", "invalid_request", "bad body"))
    assert data["response"] is None
    assert data["error"] == {"code": "invalid_request", "message": "bad body"}
    expired = json.loads(expired_line("c-4"))
    assert expired["custom_id"] == "c-4" and expired["response"] is None
    assert expired["error"] == {"code": EXPIRED_CODE, "message": EXPIRED_MESSAGE}
