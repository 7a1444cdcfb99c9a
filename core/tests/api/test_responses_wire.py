"""``servehall.api.responses_wire``: the Responses request body (input forms, items,
tools, formats, metadata bounds, strict types) and the 400 ``unsupported_parameter``
naming the first field servehall does not implement."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from servehall.api.responses_wire import (
    FunctionCallItem,
    FunctionCallOutputItem,
    MessageItem,
    NamedFunctionChoice,
    ResponsesRequest,
    check_unsupported_fields,
    parts_text,
)
from servehall.errors import UnsupportedParameterError


def _req(**kw: Any) -> ResponsesRequest:
    return ResponsesRequest.model_validate({"model": "m", **kw})


def test_input_forms() -> None:
    assert _req(input="hi").input == "hi"
    assert _req().input is None
    req = _req(
        input=[
            {"role": "user", "content": "plain"},
            {
                "type": "message",
                "role": "developer",
                "content": [{"type": "input_text", "text": "a"}, {"type": "text", "text": "b"}],
            },
            {
                "type": "function_call",
                "call_id": "c",
                "name": "f",
                "arguments": "{}",
                "id": "fc_1",
                "status": "completed",
            },
            {
                "type": "function_call_output",
                "call_id": "c",
                "output": [{"type": "output_text", "text": "ok"}],
            },
        ]
    )
    assert isinstance(req.input, list)
    kinds = [type(i) for i in req.input]
    assert kinds == [MessageItem, MessageItem, FunctionCallItem, FunctionCallOutputItem]
    assert parts_text(req.input[1].content) == "a\nb"  # type: ignore[union-attr]
    assert parts_text(req.input[3].output) == "ok"  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "body",
    [
        {"input": []},
        {"input": [{"role": "tool", "content": "x"}]},
        {"input": [{"role": "user", "content": []}]},
        {"input": [{"role": "user", "content": 3}]},
        {"input": 5},
        {"model": 3},
        {"temperature": "1"},
        {"temperature": 3},
        {"max_output_tokens": 0},
        {"store": "yes"},
        {"stream": 1},
        {"tool_choice": "any"},
        {"tools": [{"type": "function"}]},
        {"text": {"format": {"type": "yaml"}}},
        {"metadata": {"k": "v" * 513}},
        {"metadata": {f"k{i}": "v" for i in range(17)}},
        {"metadata": {"k": 1}},
        {"previous_response_id": ""},
    ],
)
def test_invalid_bodies(body: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        ResponsesRequest.model_validate({"model": "m", **body})


def test_tools_choice_and_format() -> None:
    req = _req(
        tools=[{"type": "function", "name": "f", "parameters": {"type": "object"}, "strict": True}],
        tool_choice={"type": "function", "name": "f"},
        text={
            "format": {"type": "json_schema", "name": "s", "schema": {"type": "object"}},
            "verbosity": "low",
        },
        metadata={"k": "v"},
        unknown_field="ignored",
    )
    assert req.tools is not None and req.tools[0].strict is True
    assert req.tool_choice == NamedFunctionChoice(type="function", name="f")
    assert req.text is not None and req.text.format is not None
    assert req.text.format.model_dump()["schema"] == {"type": "object"}
    assert req.store is True and req.stream is False


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"reasoning": {"effort": "high"}}, "reasoning"),
        ({"reasoning": "high"}, "reasoning"),
        ({"background": True}, "background"),
        ({"include": ["file_search_call.results"]}, "include"),
        ({"conversation": "conv_1"}, "conversation"),
        ({"truncation": "auto"}, "truncation"),
        ({"top_logprobs": 2}, "top_logprobs"),
        ({"tools": [{"type": "function", "name": "f"}, {"type": "web_search"}]}, "tools[1].type"),
        ({"tool_choice": {"type": "file_search"}}, "tool_choice"),
        ({"input": [{"role": "user", "content": "x"}, {"type": "reasoning"}]}, "input[1].type"),
        (
            {
                "input": [
                    {
                        "role": "user",
                        "content": [{"type": "input_text", "text": "x"}, {"type": "input_image"}],
                    }
                ]
            },
            "input[0].content[1].type",
        ),
        (
            {
                "input": [
                    {
                        "type": "function_call_output",
                        "call_id": "c",
                        "output": [{"type": "input_file"}],
                    }
                ]
            },
            "input[0].output[0].type",
        ),
    ],
)
def test_unsupported_fields_are_named(body: dict[str, Any], param: str) -> None:
    with pytest.raises(UnsupportedParameterError) as info:
        check_unsupported_fields({"model": "m", **body})
    assert info.value.param == param and info.value.status == 400
    assert info.value.code == "unsupported_parameter"


@pytest.mark.parametrize(
    "body",
    [
        {"reasoning": None},
        {"reasoning": {"effort": None, "summary": None}},
        {"background": False},
        {"include": []},
        {"truncation": "disabled"},
        {"top_logprobs": 0},
        {"tools": [{"type": "function", "name": "f"}, "not a dict"]},
        {"input": [{"role": "user", "content": "x"}, "junk", {"content": [3]}]},
        {"input": "text"},
    ],
)
def test_what_asks_for_nothing_passes(body: dict[str, Any]) -> None:
    check_unsupported_fields({"model": "m", **body})


def test_a_long_type_is_cut_in_the_message() -> None:
    with pytest.raises(UnsupportedParameterError) as info:
        check_unsupported_fields({"tools": [{"type": "x" * 500}]})
    assert "x" * 64 in info.value.message and "x" * 65 not in info.value.message
