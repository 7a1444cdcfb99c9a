"""Tools end to end: a real ``servehall serve`` with the demo model (openvino_cpu, f32)
and the ``openai`` client — tools and earlier calls rendered by the model's chat
template (the server's prompt is exactly the template's rendering with ``tools=``), the
tool loop (call → ``role: tool`` result → final answer) streamed and not, the 400s, and
``servehall_tool_calls_total`` exported from the start.

The demo model calls an offered tool by itself only some of the time (docs/api.md, "The
demo model and agents"; measured in ``tests/test_demo_agents_e2e.py``). The call of the loop
is forced with a named ``tool_choice`` when the engine can constrain decoding
(``structured_output``); where it cannot, the server must refuse the forced choice with
400 ``unsupported_parameter`` and the loop continues from the call a client would have
received (the parse path itself is covered by ``core/tests/tools/test_scanner.py`` and
``core/tests/api/test_tools.py``)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 12}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}
QUESTION = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def server(
    servehall_server: Callable[..., Any],
    demo_model_dir: Path,
    demo_config_factory: Callable[..., dict[str, Any]],
) -> Iterator[Any]:
    with servehall_server(
        demo_config_factory(demo_model_dir), name="tools", ready_timeout=600
    ) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server: Any) -> Any:
    import openai

    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0)


def rendered_len(model_dir: Path, messages: list[dict[str, Any]], tools: list[Any]) -> int:
    """Prompt tokens of ``messages`` rendered by the demo template with ``tools``."""
    from servehall.text import load_tokenizer
    from servehall.text.tokenizer import ChatTurn

    tok = load_tokenizer(model_dir)
    turns = []
    for m in messages:
        calls = tuple(
            {
                **c,
                "function": {**c["function"], "arguments": json.loads(c["function"]["arguments"])},
            }
            for c in m.get("tool_calls") or []
        )
        turns.append(ChatTurn(m["role"], m.get("content") or "", calls, m.get("tool_call_id")))
    return len(tok.render_chat(turns, tools))


def test_tool_call_counters_start_at_zero(server: Any) -> None:
    import httpx

    text = httpx.get(server.base_url + "/metrics").text
    for outcome in ("parsed", "failed"):
        assert (
            f'servehall_tool_calls_total{{model="demo",outcome="{outcome}",version=""}} 0.0' in text
        )


def test_tool_loop_with_the_openai_client(client: Any, demo_model_dir: Path) -> None:
    import openai

    # 1. the call: forced by name (the demo model does not always call on its own)
    named = {"type": "function", "function": {"name": "get_weather"}}
    try:
        first = client.chat.completions.create(
            model="demo", messages=QUESTION, tools=[WEATHER], tool_choice=named, max_tokens=48
        )
    except openai.BadRequestError as exc:  # this engine cannot constrain decoding yet
        assert exc.body["code"] == "unsupported_parameter" and exc.body["param"] == "tool_choice"
        call = {
            "id": "call_0123456789abcdef01234567",
            "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
        }
    else:
        choice = first.choices[0]
        assert choice.finish_reason == "tool_calls" and choice.message.content is None
        [made] = choice.message.tool_calls
        assert made.function.name == "get_weather" and made.id.startswith("call_")
        assert isinstance(json.loads(made.function.arguments)["city"], str)
        call = made.model_dump(exclude_none=True)
    assert rendered_len(demo_model_dir, QUESTION, [WEATHER]) > rendered_len(
        demo_model_dir, QUESTION, []
    )

    # 2. the result goes back as a tool message; 3. the final answer
    messages = [
        *QUESTION,
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": call["id"], "content": "18 C, sunny"},
    ]
    final = client.chat.completions.create(
        model="demo", messages=messages, tools=[WEATHER], max_tokens=24, temperature=0
    )
    choice = final.choices[0]
    assert choice.finish_reason in ("stop", "length", "tool_calls")
    # the server rendered the tools, the earlier call and its result through the template
    assert final.usage.prompt_tokens == rendered_len(demo_model_dir, messages, [WEATHER])
    assert final.usage.completion_tokens > 0
    text = choice.message.content or ""
    calls = choice.message.tool_calls or []
    pieces: list[str] = []
    streamed_calls: dict[int, list[str]] = {}
    for chunk in client.chat.completions.create(
        model="demo",
        messages=messages,
        tools=[WEATHER],
        max_tokens=24,
        temperature=0,
        stream=True,
    ):
        for c in chunk.choices:
            pieces.append(c.delta.content or "")
            for piece in c.delta.tool_calls or []:
                streamed_calls.setdefault(piece.index, []).append(piece.function.arguments or "")
    assert "".join(pieces) == text
    assert ["".join(streamed_calls[i]) for i in sorted(streamed_calls)] == [
        c.function.arguments for c in calls
    ]


def test_bad_tool_requests_are_400s(client: Any) -> None:
    import openai

    bad_schema = {**WEATHER["function"], "parameters": {"type": "object", "required": "city"}}
    for kwargs, param in [
        (
            {"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
            "tool_choice",
        ),
        ({"tools": [{"type": "function", "function": bad_schema}]}, "tools[0].function.parameters"),
        (
            {
                "tools": [WEATHER],
                "messages": [*QUESTION, {"role": "tool", "tool_call_id": "call_x", "content": "1"}],
            },
            "messages[1].tool_call_id",
        ),
    ]:
        kwargs.setdefault("messages", QUESTION)
        with pytest.raises(openai.BadRequestError) as info:
            client.chat.completions.create(model="demo", max_tokens=4, **kwargs)
        assert info.value.status_code == 400
        assert info.value.body["param"] == param, info.value.body
        assert info.value.body["type"] == "invalid_request_error"


def test_forced_call_with_response_format_and_one_call_under_auto(client: Any) -> None:
    """OpenAI's semantics: a forced call (named or ``required``) is the whole output and
    its arguments follow the tool's schema; ``response_format`` shapes content, which a
    forced call has none of, so the two together are the forced call (not a 400).
    ``parallel_tool_calls: false`` under ``auto`` is enforced by the grammar (at most one
    call), not refused; strict ``auto`` tools with ``response_format`` stay a 400 (two
    constraints on one output)."""
    import openai

    named = {"type": "function", "function": {"name": "get_weather"}}
    for choice in (named, "required"):
        done = client.chat.completions.create(
            model="demo",
            messages=QUESTION,
            tools=[WEATHER],
            tool_choice=choice,
            parallel_tool_calls=False,  # one call: the random model closes the array
            response_format={"type": "json_object"},
            max_tokens=128,  # the random model may fill the 12-character city
            seed=1,
        )
        out = done.choices[0]
        assert out.finish_reason == "tool_calls", out
        assert [c.function.name for c in out.message.tool_calls] == ["get_weather"]
        assert isinstance(json.loads(out.message.tool_calls[0].function.arguments)["city"], str)
    for stream in (False, True):
        got = client.chat.completions.create(
            model="demo",
            messages=QUESTION,
            tools=[WEATHER],
            tool_choice="auto",
            parallel_tool_calls=False,
            max_tokens=32,
            seed=2,
            stream=stream,
        )
        if stream:
            indexes = {p.index for ch in got for p in (ch.choices[0].delta.tool_calls or [])}
            assert len(indexes) <= 1
        else:
            assert len(got.choices[0].message.tool_calls or []) <= 1
    strict = {**WEATHER, "function": {**WEATHER["function"], "strict": True}}
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(
            model="demo",
            messages=QUESTION,
            tools=[strict],
            response_format={"type": "json_object"},
            max_tokens=8,
        )
    assert info.value.body["param"] == "response_format", info.value.body
