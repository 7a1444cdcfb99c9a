"""servehall.errors: the status of an error code (what a client reads from a stream's
error event, which carries no HTTP status)."""

from __future__ import annotations

import pytest

from servehall.errors import (
    EngineError,
    EngineUnavailableError,
    QueueFullError,
    ServehallError,
    status_of_code,
)


@pytest.mark.parametrize(
    ("code", "status"),
    [
        ("engine_unavailable", 503),
        ("queue_full", 503),
        ("engine_error", 500),
        ("context_length_exceeded", 400),
        ("content_filter", 400),
    ],
)
def test_a_declared_code_has_its_class_status(code: str, status: int) -> None:
    assert status_of_code(code) == status


def test_an_unknown_code_has_none() -> None:
    assert status_of_code("no_such_code") is None


def test_the_503_and_500_envelopes_share_a_type_but_not_a_status() -> None:
    # why the code decides: both are type "server_error" on the wire
    unavailable = EngineUnavailableError("worker died").envelope()["error"]
    failed = EngineError("boom").envelope()["error"]
    assert unavailable["type"] == failed["type"] == "server_error"
    assert status_of_code(unavailable["code"]) == 503
    assert status_of_code(failed["code"]) == 500
    assert issubclass(QueueFullError, ServehallError)
