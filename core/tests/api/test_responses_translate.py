"""``servehall.api.responses_translate``: a Responses request as a chat-completions
body (and chat field names back as Responses names), a finished choice as ``output``
items and the ``response`` object, and the stream of one choice as Responses events."""

from __future__ import annotations

import json

from servehall.api.responses_translate import (
    EventWriter,
    chat_body,
    chat_messages,
    input_items,
    output_as_input,
    output_items,
    public_message,
    public_param,
    response_object,
    sse,
    status_of,
    usage_object,
)
from servehall.api.responses_wire import ResponsesRequest
from servehall.tools.calls import ToolCall, ToolCallDelta

TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "Weather in a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}


# --- translation, both ways ------------------------------------------------------------


def test_request_becomes_a_chat_body() -> None:
    req = ResponsesRequest.model_validate(
        {
            "model": "m",
            "instructions": "Be brief.",
            "input": [
                {"role": "user", "content": [{"type": "input_text", "text": "weather?"}]},
                {
                    "type": "function_call",
                    "call_id": "call_1",
                    "name": "get_weather",
                    "arguments": '{"city":"Paris"}',
                },
                {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
            ],
            "tools": [TOOL],
            "tool_choice": {"type": "function", "name": "get_weather"},
            "text": {"format": {"type": "json_schema", "name": "t", "schema": {"type": "object"}}},
            "max_output_tokens": 9,
            "temperature": 0.5,
        }
    )
    body = chat_body(req, [{"type": "message", "role": "user", "content": "earlier"}])
    assert body["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "earlier"},
        {"role": "user", "content": "weather?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    ]
    assert body["tools"] == [
        {"type": "function", "function": {k: v for k, v in TOOL.items() if k != "type"}}
    ]
    assert body["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
    assert body["response_format"]["json_schema"]["schema"] == {"type": "object"}
    assert body["max_completion_tokens"] == 9 and body["temperature"] == 0.5


def test_chat_names_become_responses_names() -> None:
    assert public_param("messages[3].tool_call_id") == "input"
    assert public_param("max_completion_tokens") == "max_output_tokens"
    assert public_param("response_format.json_schema.schema") == "text.format.schema"
    assert public_param("tools[2].function.parameters") == "tools[2].parameters"
    assert public_param("temperature") == "temperature"
    assert "'text.format.name'" in public_message("'response_format.json_schema.name' must")


def test_output_items_become_input_items() -> None:
    output = [
        {"type": "message", "content": [{"type": "output_text", "text": "hi"}]},
        {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}", "id": "fc"},
    ]
    assert output_as_input(output) == [
        {"type": "message", "role": "assistant", "content": "hi"},
        {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
    ]


def _req(**kw: object) -> ResponsesRequest:
    return ResponsesRequest.model_validate({"model": "m", **kw})


def test_input_items_of_a_string_and_of_none() -> None:
    assert input_items(_req(input="hi")) == [{"type": "message", "role": "user", "content": "hi"}]
    assert input_items(_req()) == []


def test_chat_body_of_a_bare_request_has_only_what_was_asked() -> None:
    body = chat_body(_req(input="hi", stream=True), [])
    assert body == {
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}],
        "stream": True,
    }
    body = chat_body(
        _req(input="hi", text={"format": {"type": "json_object"}}, tool_choice="required"), []
    )
    assert body["response_format"] == {"type": "json_object"}
    assert body["tool_choice"] == "required"
    assert "response_format" not in chat_body(
        _req(input="x", text={"format": {"type": "text"}}), []
    )


def test_function_calls_join_the_assistant_message_before_them() -> None:
    call = {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"}
    call2 = {**call, "call_id": "c2"}
    messages = chat_messages(
        None,
        [
            {"type": "message", "role": "assistant", "content": "Checking."},
            call,
            call2,
            {"type": "function_call_output", "call_id": "c1", "output": "ok"},
            {"type": "message", "role": "assistant", "content": ""},
            {**call, "call_id": "c3"},
        ],
    )
    assert [m["role"] for m in messages] == ["assistant", "tool", "assistant", "assistant"]
    assert messages[0]["content"] == "Checking."
    assert [c["id"] for c in messages[0]["tool_calls"]] == ["c1", "c2"]
    # An empty assistant message does not take the call: a new one does.
    assert "tool_calls" not in messages[2]
    assert messages[3] == {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "c3", "type": "function", "function": {"name": "f", "arguments": "{}"}}
        ],
    }


def test_names_in_messages_and_unmatched_names() -> None:
    assert public_param(None) is None
    assert public_param("messages") == "input"
    assert public_param("response_format") == "text.format"
    assert public_param("response_format.type") == "text.format.type"
    msg = public_message(
        "'max_completion_tokens' and tools[1].function.name and messages[0].content"
    )
    assert msg == "'max_output_tokens' and tools[1].name and input"


def test_status_of_finish_reasons() -> None:
    assert status_of("stop") == ("completed", None)
    assert status_of("tool_calls") == ("completed", None)
    assert status_of(None) == ("completed", None)
    assert status_of("length") == ("incomplete", {"reason": "max_output_tokens"})
    assert status_of("content_filter") == ("incomplete", {"reason": "content_filter"})


def test_output_items() -> None:
    calls = [ToolCall("call_1", "f", '{"a":1}')]
    only_call = output_items(None, calls, "tool_calls")
    assert [i["type"] for i in only_call] == ["function_call"]
    assert only_call[0]["id"].startswith("fc_") and len(only_call[0]["id"]) == 3 + 32
    assert (only_call[0]["call_id"], only_call[0]["name"], only_call[0]["arguments"]) == (
        "call_1",
        "f",
        '{"a":1}',
    )
    both = output_items("Sure.", calls, "tool_calls")
    assert [i["type"] for i in both] == ["message", "function_call"]
    assert both[0]["content"][0]["text"] == "Sure." and both[0]["status"] == "completed"
    empty = output_items("", [], "length")
    assert len(empty) == 1 and empty[0]["status"] == "incomplete"
    assert empty[0]["content"][0]["text"] == ""


def test_usage_and_response_object_defaults() -> None:
    usage = usage_object(7, 3)
    assert (
        usage["input_tokens"] == 7 and usage["output_tokens"] == 3 and usage["total_tokens"] == 10
    )
    obj = response_object(
        "resp_1", 123, _req(input="hi"), status="completed", output=[], usage=usage
    )
    assert obj["object"] == "response" and obj["id"] == "resp_1" and obj["created_at"] == 123
    assert obj["temperature"] == 1.0 and obj["top_p"] == 1.0 and obj["parallel_tool_calls"] is True
    assert obj["text"] == {"format": {"type": "text"}} and obj["tool_choice"] == "auto"
    assert obj["tools"] == [] and obj["metadata"] == {} and obj["error"] is None
    named = response_object(
        "r",
        1,
        _req(
            tools=[TOOL], tool_choice={"type": "function", "name": "get_weather"}, temperature=0.2
        ),
        status="incomplete",
        output=[],
        usage=None,
        incomplete_details={"reason": "max_output_tokens"},
    )
    assert named["tool_choice"] == {"type": "function", "name": "get_weather"}
    assert named["temperature"] == 0.2 and named["tools"][0]["name"] == "get_weather"
    assert named["incomplete_details"] == {"reason": "max_output_tokens"}


def test_sse_event_text() -> None:
    raw = sse({"type": "response.created", "x": "é"})
    assert raw == 'event: response.created\ndata: {"type":"response.created","x":"é"}\n\n'.encode()


def test_event_writer_text_then_call() -> None:
    w = EventWriter("resp_1", _req(input="hi"))
    events = w.start()
    events += w.text("Let me ")
    events += w.text("check.")
    events += w.call(ToolCallDelta(0, "", "call_1", "f"))
    events += w.call(ToolCallDelta(0, '{"a":'))
    events += w.call(ToolCallDelta(0, "1}"))
    events += w.finish("tool_calls", usage_object(1, 2))
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert [e["type"] for e in events] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert events[6]["text"] == "Let me check."
    assert events[12]["arguments"] == '{"a":1}' and events[12]["output_index"] == 1
    final = events[-1]["response"]
    assert final["status"] == "completed" and final["usage"]["total_tokens"] == 3
    assert [i["type"] for i in final["output"]] == ["message", "function_call"]
    assert final["output"][1]["call_id"] == "call_1" and w.final is final
    json.dumps(events)  # every event is JSON


def test_event_writer_incomplete_and_failed() -> None:
    w = EventWriter("resp_1", _req(input="hi"))
    w.start()
    w.text("cut")
    events = w.finish("length", usage_object(1, 1))
    assert events[-1]["type"] == "response.incomplete"
    final = events[-1]["response"]
    assert final["incomplete_details"] == {"reason": "max_output_tokens"}
    assert final["output"][0]["status"] == "incomplete"
    f = EventWriter("resp_2", _req(input="hi"))
    f.start()
    f.text("partial")
    [failed] = f.fail(None, "engine died", usage_object(1, 0))
    assert failed["type"] == "response.failed"
    assert failed["response"]["error"] == {"code": "server_error", "message": "engine died"}
    assert failed["response"]["output"] == []  # the open item is left out


def test_event_writer_with_no_output_matches_the_non_streamed_one() -> None:
    for reason in ("stop", "length"):
        w = EventWriter("resp_1", _req(input="hi"))
        w.start()
        events = w.finish(reason, usage_object(1, 0))
        streamed = events[-1]["response"]["output"]
        plain = output_items("", [], reason)
        assert [(i["type"], i["status"], i["content"]) for i in streamed] == [
            (i["type"], i["status"], i["content"]) for i in plain
        ], reason
