"""Request models and the validation error envelope (small, param names the field)."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from servehall.api.errors import MAX_LISTED_ERRORS, from_validation_error
from servehall.api.wire import ChatCompletionRequest, CompletionRequest


def _err(model: Any, body: dict[str, Any]) -> Any:
    with pytest.raises(ValidationError) as ei:
        model.model_validate(body)
    return from_validation_error(ei.value)


MSG = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("max_tokens", 0),
        ("max_tokens", -1),
        ("max_tokens", 1.5),
        ("max_tokens", "10"),
        ("max_tokens", True),
        ("temperature", -1),
        ("temperature", 2.5),
        ("temperature", "1"),
        ("temperature", float("nan")),
        ("temperature", float("inf")),
        ("top_p", 1.1),
        ("top_p", -0.1),
        ("n", 0),
        ("presence_penalty", 3),
        ("frequency_penalty", -3),
        ("stop", [""]),
        ("stop", ""),
        ("stop", ["a"] * 17),
        ("stop", 5),
        ("seed", "1"),
        ("stream", "yes"),
        ("model", 5),
        ("priority", 1.5),
        ("priority", "high"),
        ("priority", 1001),
    ],
)
def test_bad_fields_name_the_param(field: str, value: Any) -> None:
    err = _err(ChatCompletionRequest, {"model": "m", "messages": MSG, field: value})
    assert err.status == 400 and err.param == field
    assert repr(value) not in err.message or len(repr(value)) < 3


@pytest.mark.parametrize(
    "messages",
    [
        [],
        {},
        None,
        "hi",
        [{"role": "wizard", "content": "x"}],
        [{"role": "user"}],
        [{"role": "user", "content": []}],
        [{"role": "user", "content": [{"type": "text", "text": 1}]}],
    ],
)
def test_bad_messages(messages: Any) -> None:
    assert _err(ChatCompletionRequest, {"model": "m", "messages": messages}).param == "messages"
    assert _err(ChatCompletionRequest, {"model": "m"}).param == "messages"


def test_error_list_is_capped_without_echo() -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": 987654}] * 5000}
    err = _err(ChatCompletionRequest, body)
    assert err.message.count("messages[") == MAX_LISTED_ERRORS
    assert "987654" not in err.message and len(err.message) < 1000
    assert "4995 more" in err.message


def test_valid_requests() -> None:
    r = ChatCompletionRequest.model_validate(
        {
            "model": "m",
            "messages": [
                *MSG,
                {"role": "assistant", "content": None},
                {
                    "role": "user",
                    "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
                },
            ],
            "stop": None,
            "temperature": 0,
            "max_tokens": 3,
            "unknown_field": 1,
        }
    )
    assert r.messages[2].text() == "a\nb" and r.stop_list() == []
    assert not r.include_usage
    c = CompletionRequest.model_validate(
        {
            "model": "m",
            "prompt": ["x"],
            "stop": "s",
            "stream": True,
            "stream_options": {"include_usage": True},
        }
    )
    assert c.prompt_text() == "x" and c.stop_list() == ["s"] and c.include_usage
