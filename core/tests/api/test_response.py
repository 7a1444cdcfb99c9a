"""``servehall.api.response``: response headers (content length or no-buffering, extra
headers lower-cased, non-latin-1 ones dropped), every choice run to its end (a failure
propagates and the other choices are aborted), and the one JSON body of a chat or text
completion with usage."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from servehall.api.response import dumps, response_headers, run_choices, send_completion
from servehall.config.settings import Settings
from servehall.engines.contract import SamplingParams, TokenDelta
from servehall.errors import EngineError
from servehall.plugin.host import Host
from servehall.plugin.manager import PluginHost
from servehall.serving.choice import ChoiceStream
from servehall.serving.request import RequestState
from servehall.text.detokenize import IncrementalDetokenizer
from servehall.tools.parsers import HERMES

sys.path.insert(0, str(Path(__file__).parents[1]))
from api_fixtures import DeltaScriptEngine as Engine

VOCAB = [b"Hi", b" there", b"<tool_call>", b'{"name": "f", "arguments": {"x": 1}}', b"</tool_call>"]


def _state(engine: Engine, tools: bool = False) -> RequestState:
    host = Host(settings=Settings(), plugins=PluginHost([]))
    state = RequestState(host, None, "req-1", "/v1/chat/completions", None)
    state.choices = [
        ChoiceStream(
            engine=engine,  # type: ignore[arg-type]
            index=i,
            request_id=rid,
            prompt_ids=[0],
            params=SamplingParams(max_tokens=8),
            detok=IncrementalDetokenizer(VOCAB),
            tools=HERMES.stream(lambda: "call_1") if tools else None,
        )
        for i, rid in enumerate(engine.scripts)
    ]
    state.prompt_tokens = 4
    return state


def test_headers() -> None:
    fixed = response_headers({"X-Request-Id": "r1"}, "application/json", 12)
    assert fixed == [
        (b"content-type", b"application/json"),
        (b"content-length", b"12"),
        (b"x-request-id", b"r1"),
    ]
    stream = response_headers({"ok": "é", "bad": "☃"}, "text/event-stream")
    assert stream == [
        (b"content-type", b"text/event-stream"),
        (b"cache-control", b"no-cache"),
        (b"x-accel-buffering", b"no"),
        (b"ok", "é".encode("latin-1")),
    ]


def test_dumps_is_compact_and_keeps_characters() -> None:
    assert dumps({"a": [1, "é"]}) == '{"a":[1,"é"]}'


async def _send(
    state: RequestState, kind: str = "chat", echo: str = ""
) -> tuple[dict[str, Any], dict[str, Any]]:
    sent: list[dict[str, Any]] = []

    async def send(message: Any) -> None:
        sent.append(message)

    await send_completion(state, kind, "m", send, {"x-a": "1"}, echo)  # type: ignore[arg-type]
    start, body = sent
    assert not body["more_body"]
    return start, json.loads(body["body"])


async def test_chat_completion_body() -> None:
    engine = Engine(
        {
            "a": [(0, TokenDelta((0,))), (0, TokenDelta((1,), "stop"))],
            "b": [(0, TokenDelta((0,), "length"))],
        }
    )
    state = _state(engine)
    start, body = await _send(state)
    assert start["status"] == 200
    assert dict(start["headers"])[b"content-length"] == str(len(dumps(body).encode())).encode()
    assert body["object"] == "chat.completion" and body["id"] == "req-1" and body["model"] == "m"
    assert body["choices"] == [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "Hi there"},
            "logprobs": None,
            "finish_reason": "stop",
        },
        {
            "index": 1,
            "message": {"role": "assistant", "content": "Hi"},
            "logprobs": None,
            "finish_reason": "length",
        },
    ]
    assert body["usage"] == {"prompt_tokens": 4, "completion_tokens": 3, "total_tokens": 7}
    assert state.response_started


async def test_chat_completion_with_a_tool_call() -> None:
    engine = Engine({"a": [(0, TokenDelta((2, 3, 4), "stop"))]})
    _, body = await _send(_state(engine, tools=True))
    [choice] = body["choices"]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] is None
    assert choice["message"]["tool_calls"] == [
        {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}}
    ]


async def test_text_completion_with_echo() -> None:
    engine = Engine({"a": [(0, TokenDelta((0, 1), "stop"))]})
    _, body = await _send(_state(engine), kind="completion", echo="Say: ")
    assert body["object"] == "text_completion"
    assert body["choices"][0]["text"] == "Say: Hi there"


async def test_a_failing_choice_propagates_and_aborts_the_others() -> None:
    engine = Engine(
        {
            "a": [(0, TokenDelta((0,))), (10, TokenDelta((1,), "stop"))],
            "b": [(0.01, TokenDelta((), "error", "boom"))],
        }
    )
    state = _state(engine)
    with pytest.raises(EngineError, match="boom"):
        await run_choices(state)
    assert engine.aborted == ["a"]
    assert not state.response_started
