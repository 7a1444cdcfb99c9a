"""The soak's clients (servehall.bench.soak.clients): how an answer is read — the status
a stream's error event stands for, and the token usage of every body and stream shape."""

from __future__ import annotations

from servehall.bench.soak.clients import _error_status, _usage


def test_a_stream_error_event_of_a_worker_death_counts_as_503() -> None:
    # the envelope of engine_unavailable inside a 200 stream: type server_error, no
    # status; the soak allowed it in a fault window only once it read the code
    from servehall.errors import EngineError, EngineUnavailableError

    assert _error_status(EngineUnavailableError("worker died").envelope()) == 503
    assert _error_status(EngineError("boom").envelope()) == 500
    assert _error_status({"error": {"type": "server_error"}}) == 500
    assert _error_status({"error": {"type": "invalid_request_error", "code": None}}) == 400
    assert _error_status({"error": {"code": 429}}) == 429
    assert _error_status("not an envelope") == 500


def test_usage_of_chat_responses_and_the_end_of_a_responses_stream() -> None:
    assert _usage({"usage": {"prompt_tokens": 3, "completion_tokens": 5}}) == (3, 5)
    assert _usage({"usage": {"prompt_tokens": 3, "completion_tokens": None}}) == (3, 0)
    assert _usage({"usage": {"input_tokens": 4, "output_tokens": 2}}) == (4, 2)
    end = {"type": "response.completed", "response": {"usage": {"input_tokens": 7}}}
    assert _usage(end) == (7, 0)
    assert _usage({"type": "response.output_text.delta", "usage": None}) is None
    assert _usage({"choices": []}) is None
    assert _usage("not a body") is None
