"""``servehall.api.sse``: choices merged in arrival order (a failure raised, the others
cancelled), and the SSE body ``send_stream`` writes — role chunks, content and
finish chunks, the tail (last final chunk, usage, ``[DONE]``) in one body message, an
error event after the 200, and an engine refusal raised before the headers when asked."""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from servehall.api.sse import first_then_rest, merged_events, send_stream
from servehall.config.settings import Settings
from servehall.engines.contract import SamplingParams, TokenDelta
from servehall.errors import InvalidRequestError
from servehall.plugin.host import Host
from servehall.plugin.manager import PluginHost
from servehall.serving.choice import ChoiceEvent, ChoiceStream
from servehall.serving.request import RequestState
from servehall.text.detokenize import IncrementalDetokenizer

sys.path.insert(0, str(Path(__file__).parents[1]))
from api_fixtures import DeltaScriptEngine as Engine

VOCAB = [b"Hi", b" there", b"!", b" more"]


def _choices(engine: Engine) -> list[ChoiceStream]:
    return [
        ChoiceStream(
            engine=engine,  # type: ignore[arg-type]
            index=i,
            request_id=rid,
            prompt_ids=[0],
            params=SamplingParams(max_tokens=8),
            detok=IncrementalDetokenizer(VOCAB),
        )
        for i, rid in enumerate(engine.scripts)
    ]


async def _collect(gen: Any) -> list[ChoiceEvent]:
    return [e async for e in gen]


async def test_one_choice_passes_through() -> None:
    engine = Engine({"a": [(0, TokenDelta((0,))), (0, TokenDelta((1,), "stop"))]})
    events = await _collect(merged_events(_choices(engine)))
    assert [(e.index, e.text, e.finish_reason) for e in events] == [
        (0, "Hi", None),
        (0, " there", "stop"),
    ]


async def test_several_choices_merge_in_arrival_order() -> None:
    engine = Engine(
        {
            "a": [(0.0, TokenDelta((0,))), (0.05, TokenDelta((1,), "stop"))],
            "b": [(0.02, TokenDelta((2,))), (0.0, TokenDelta((3,), "length"))],
        }
    )
    events = await _collect(merged_events(_choices(engine)))
    assert [(e.index, e.text) for e in events] == [(0, "Hi"), (1, "!"), (1, " more"), (0, " there")]
    assert engine.aborted == []


async def test_a_failing_choice_raises_and_cancels_the_others() -> None:
    engine = Engine(
        {
            "a": [(0, TokenDelta((0,))), (10, TokenDelta((1,), "stop"))],
            "b": [(0.01, TokenDelta((), "error", "refused", "invalid_request"))],
        }
    )
    with pytest.raises(InvalidRequestError, match="refused"):
        await _collect(merged_events(_choices(engine)))
    assert engine.aborted == ["a"]  # the slow choice was cut short and its request aborted


async def test_closing_the_merge_aborts_every_unfinished_choice() -> None:
    engine = Engine(
        {
            "a": [(0, TokenDelta((0,))), (10, TokenDelta((1,), "stop"))],
            "b": [(10, TokenDelta((2,), "stop"))],
        }
    )
    gen = merged_events(_choices(engine))
    first = await anext(gen)
    assert first.text == "Hi"
    await gen.aclose()
    assert sorted(engine.aborted) == ["a", "b"]


async def test_first_then_rest() -> None:
    async def rest() -> AsyncIterator[ChoiceEvent]:
        yield ChoiceEvent(0, "b")

    got = await _collect(first_then_rest(ChoiceEvent(0, "a"), rest()))  # type: ignore[arg-type]
    assert [e.text for e in got] == ["a", "b"]
    got = await _collect(first_then_rest(None, rest()))  # type: ignore[arg-type]
    assert [e.text for e in got] == ["b"]


@dataclass
class Req:
    model: str = "m"
    include_usage: bool = False


def _state(engine: Engine) -> RequestState:
    host = Host(settings=Settings(), plugins=PluginHost([]))
    state = RequestState(host, None, "req-1", "/v1/chat/completions", None)
    state.choices = _choices(engine)
    state.prompt_tokens = 3
    return state


async def _send(
    state: RequestState, kind: str = "chat", req: Req | None = None, **kw: Any
) -> list[dict[str, Any]]:
    sent: list[dict[str, Any]] = []

    async def send(message: Any) -> None:
        sent.append(message)

    await send_stream(state, kind, req or Req(), send, {}, kw.pop("echo", ""), **kw)  # type: ignore[arg-type]
    return sent


def _data(body: bytes) -> list[Any]:
    out = []
    for block in body.decode().split("\n\n"):
        if block:
            assert block.startswith("data: ")
            payload = block.removeprefix("data: ")
            out.append(payload if payload == "[DONE]" else json.loads(payload))
    return out


async def test_chat_stream_shape_and_tail_in_one_message() -> None:
    engine = Engine({"a": [(0, TokenDelta((0,))), (0, TokenDelta((1,), "stop"))]})
    state = _state(engine)
    sent = await _send(state, req=Req(include_usage=True))
    start = sent[0]
    assert start["type"] == "http.response.start" and start["status"] == 200
    assert (b"content-type", b"text/event-stream; charset=utf-8") in start["headers"]
    bodies = [m for m in sent[1:]]
    assert all(m["more_body"] for m in bodies[:-1]) and not bodies[-1]["more_body"]
    role, hi = (_data(m["body"])[0] for m in bodies[:2])
    assert role["object"] == "chat.completion.chunk" and role["id"] == "req-1"
    assert role["choices"] == [
        {
            "index": 0,
            "delta": {"role": "assistant", "content": ""},
            "logprobs": None,
            "finish_reason": None,
        }
    ]
    assert hi["choices"][0]["delta"] == {"content": "Hi"}
    tail = _data(bodies[-1]["body"])
    # the final text, then an empty finish chunk, usage and [DONE], all in the last message
    assert tail[0]["choices"][0]["delta"] == {"content": " there"}
    assert tail[0]["choices"][0]["finish_reason"] is None
    assert tail[1]["choices"][0] == {
        "index": 0,
        "delta": {},
        "logprobs": None,
        "finish_reason": "stop",
    }
    assert tail[2]["choices"] == [] and tail[2]["usage"] == {
        "prompt_tokens": 3,
        "completion_tokens": 2,
        "total_tokens": 5,
    }
    assert tail[3] == "[DONE]" and len(tail) == 4
    assert state.response_started


async def test_completion_stream_with_echo_and_no_usage() -> None:
    engine = Engine({"a": [(0, TokenDelta((0, 1), "length"))]})
    sent = await _send(_state(engine), kind="completion", echo="Say: ")
    chunks = [c for m in sent[1:] for c in _data(m["body"])]
    assert chunks[0]["object"] == "text_completion"
    assert [c["choices"][0]["text"] for c in chunks[:-1]] == ["Say: ", "Hi there"]
    assert chunks[1]["choices"][0]["finish_reason"] == "length"
    assert chunks[-1] == "[DONE]"


async def test_an_error_after_the_start_is_an_error_event() -> None:
    engine = Engine({"a": [(0, TokenDelta((0,))), (0, TokenDelta((), "error", "boom"))]})
    state = _state(engine)
    sent = await _send(state)
    tail = _data(sent[-1]["body"])
    assert tail[0]["error"]["message"] == "boom" and tail[0]["error"]["code"] == "engine_error"
    assert tail[-1] == "[DONE]"
    assert state.record.error_code == "engine_error"


async def test_first_before_headers_raises_an_early_refusal() -> None:
    engine = Engine({"a": [(0, TokenDelta((), "error", "bad grammar", "invalid_request"))]})
    state = _state(engine)
    with pytest.raises(InvalidRequestError):
        await _send(state, first_before_headers=True)
    assert not state.response_started
    # Without it, the same refusal is an error event after the 200.
    engine2 = Engine({"a": [(0, TokenDelta((), "error", "bad grammar", "invalid_request"))]})
    sent = await _send(_state(engine2))
    assert sent[0]["status"] == 200
    assert _data(sent[-1]["body"])[0]["error"]["type"] == "invalid_request_error"


async def test_first_before_headers_keeps_the_first_event() -> None:
    engine = Engine({"a": [(0, TokenDelta((0,))), (0, TokenDelta((1,), "stop"))]})
    sent = await _send(_state(engine), first_before_headers=True)
    texts = [
        c["choices"][0]["delta"].get("content")
        for m in sent[1:]
        for c in _data(m["body"])
        if isinstance(c, dict) and c["choices"]
    ]
    assert texts == ["", "Hi", " there", None]
