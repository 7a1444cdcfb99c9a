"""``servehall.api.prompt``: the text parts input filters see (with the message each
belongs to) and the chat turns the template renders from them."""

from __future__ import annotations

from typing import Any

from servehall.api.prompt import chat_turns, prompt_texts
from servehall.api.wire import ChatCompletionRequest, CompletionRequest
from servehall.text.tokenizer import ChatTurn


def _chat(messages: list[dict[str, Any]]) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate({"model": "m", "messages": messages})


def test_a_completion_is_one_part() -> None:
    for prompt in ("hello", ["hello"]):
        req = CompletionRequest.model_validate({"model": "m", "prompt": prompt})
        assert prompt_texts(req) == (["hello"], [0])


def test_chat_parts_in_order_with_their_message() -> None:
    req = _chat(
        [
            {"role": "system", "content": "be brief"},
            {
                "role": "user",
                "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
            },
            {"role": "assistant", "content": None, "tool_calls": _calls()},
        ]
    )
    assert prompt_texts(req) == (["be brief", "a", "b", ""], [0, 1, 1, 2])


def _calls() -> list[dict[str, Any]]:
    return [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}},
        {"id": "c2", "type": "function", "function": {"name": "g", "arguments": "not json"}},
    ]


def test_turns_join_filtered_parts_and_map_roles() -> None:
    req = _chat(
        [
            {"role": "developer", "content": "rules"},
            {
                "role": "user",
                "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
            },
        ]
    )
    texts, owners = prompt_texts(req)
    filtered = [t.upper() for t in texts]  # what an input filter may do
    assert chat_turns(req, filtered, owners) == [
        ChatTurn("system", "RULES"),
        ChatTurn("user", "A\nB"),
    ]


def test_assistant_tool_calls_and_tool_results_keep_their_fields() -> None:
    req = _chat(
        [
            {"role": "user", "content": "go"},
            {"role": "assistant", "content": None, "tool_calls": _calls()},
            {"role": "tool", "content": "42", "tool_call_id": "c1"},
        ]
    )
    turns = chat_turns(req, *prompt_texts(req))
    assert turns[1].role == "assistant" and turns[1].content == ""
    assert [c["function"]["arguments"] for c in turns[1].tool_calls] == [{"x": 1}, "not json"]
    assert turns[1].tool_calls[0] == {
        "id": "c1",
        "type": "function",
        "function": {"name": "f", "arguments": {"x": 1}},
    }
    assert turns[2] == ChatTurn("tool", "42", tool_call_id="c1")


def test_an_assistant_turn_without_calls_is_plain() -> None:
    req = _chat([{"role": "assistant", "content": "hi"}])
    assert chat_turns(req, *prompt_texts(req)) == [ChatTurn("assistant", "hi")]
