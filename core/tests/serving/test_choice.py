"""``servehall.serving.choice``: one choice's events from a scripted engine — finish
reasons (engine end, stop string, filter block, tool calls), the engine request aborted
exactly when the choice ends before the engine did, engine errors mapped to the client's
status, timing, and the content/tool-call views. (Usage counts:
``test_choice_usage.py``.)"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence

import pytest

from servehall.admission.filters import FilterVerdict, StreamFilterResult
from servehall.engines.contract import SamplingParams, TokenDelta
from servehall.errors import EngineError, EngineUnavailableError, InvalidRequestError
from servehall.serving.choice import ChoiceEvent, ChoiceStream, engine_failure
from servehall.text.detokenize import IncrementalDetokenizer
from servehall.text.stops import StopMatcher
from servehall.tools.parsers import HERMES

WORDS = [
    "Hello",
    " world",
    " STOP",
    " again",
    "<tool_call>",
    '{"name": "f", ',
    '"arguments": {}}',
    "</tool_call>",
]
VOCAB = [w.encode() for w in WORDS]


class ScriptEngine:
    """Yields the given deltas; records aborts."""

    backend = "script"

    def __init__(self, deltas: Sequence[TokenDelta]) -> None:
        self.deltas = list(deltas)
        self.aborted: list[str] = []
        self.closed = False

    def add_request(
        self, request_id: str, prompt_token_ids: Sequence[int], params: SamplingParams
    ) -> AsyncIterator[TokenDelta]:
        async def run() -> AsyncIterator[TokenDelta]:
            try:
                for d in self.deltas:
                    yield d
            finally:
                self.closed = True

        return run()

    async def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)


def _choice(deltas: Sequence[TokenDelta], **kw: object) -> tuple[ChoiceStream, ScriptEngine]:
    engine = ScriptEngine(deltas)
    choice = ChoiceStream(
        engine=engine,  # type: ignore[arg-type]
        index=2,
        request_id="req-1",
        prompt_ids=[0],
        params=SamplingParams(max_tokens=16),
        detok=IncrementalDetokenizer(VOCAB),
        **kw,  # type: ignore[arg-type]
    )
    return choice, engine


def _events(choice: ChoiceStream) -> list[ChoiceEvent]:
    async def drain() -> list[ChoiceEvent]:
        return [e async for e in choice.events()]

    return asyncio.run(drain())


@pytest.mark.parametrize(
    ("engine_reason", "finish"), [("stop", "stop"), ("length", "length"), ("abort", "abort")]
)
def test_engine_end_maps_finish_reason_and_does_not_abort(engine_reason: str, finish: str) -> None:
    choice, engine = _choice([TokenDelta((0,)), TokenDelta((1,), engine_reason)])  # type: ignore[arg-type]
    events = _events(choice)
    assert [(e.index, e.text, e.finish_reason) for e in events] == [
        (2, "Hello", None),
        (2, " world", finish),
    ]
    assert engine.aborted == [] and engine.closed
    assert choice.text == "Hello world" and choice.content == "Hello world"
    assert choice.completion_tokens == 2 and choice.finish_reason == finish
    assert choice.tool_calls == []


def test_stop_string_ends_the_choice_and_aborts_the_engine() -> None:
    choice, engine = _choice(
        [
            TokenDelta((0,)),
            TokenDelta((1,)),
            TokenDelta((2,)),
            TokenDelta((3,)),
            TokenDelta((), "length"),
        ],
        stops=StopMatcher([" STOP"]),
    )
    events = _events(choice)
    assert "".join(e.text for e in events) == "Hello world"
    assert events[-1].finish_reason == "stop"
    assert engine.aborted == ["req-1"]
    assert choice.completion_tokens == 3  # through the token completing the stop string


def test_empty_final_delta_still_ends_the_choice() -> None:
    choice, engine = _choice([TokenDelta((0,)), TokenDelta((), "stop")])
    events = _events(choice)
    assert events[-1] == ChoiceEvent(2, "", "stop", None)
    assert engine.aborted == []


class BlockAt:
    """Blocks at the first feed containing ``word`` (sending what came before it)."""

    def __init__(self, word: str) -> None:
        self.word = word

    def feed(self, text: str) -> StreamFilterResult:
        at = text.find(self.word)
        if at >= 0:
            return StreamFilterResult(
                text[:at], (FilterVerdict("block", "no-stop", "output"),), True
            )
        return StreamFilterResult(text)

    def finish(self) -> StreamFilterResult:
        return StreamFilterResult("")


def test_output_filter_block_is_content_filter_and_aborts() -> None:
    choice, engine = _choice(
        [TokenDelta((0,)), TokenDelta((1, 2, 3)), TokenDelta((), "length")],
        filters=[BlockAt("STOP")],
    )
    events = _events(choice)
    assert [(e.text, e.finish_reason) for e in events] == [
        ("Hello", None),
        (" world ", "content_filter"),
    ]
    assert engine.aborted == ["req-1"]
    assert [v.rule for v in choice.verdicts] == ["no-stop"]
    assert choice.completion_tokens == 2


@pytest.mark.parametrize(
    ("code", "error"),
    [
        ("invalid_request", InvalidRequestError),
        ("engine_unavailable", EngineUnavailableError),
        (None, EngineError),
    ],
)
def test_engine_error_delta_raises_the_clients_error(code: str | None, error: type) -> None:
    delta = TokenDelta((), "error", "bad grammar", code)
    choice, engine = _choice([TokenDelta((0,)), delta], refusal_param="response_format")
    with pytest.raises(error) as info:
        _events(choice)
    assert info.value.message == "bad grammar"
    assert engine.aborted == []  # the engine already ended the request
    if code == "invalid_request":
        assert info.value.param == "response_format"
    if code == "engine_unavailable":
        assert info.value.headers == {"Retry-After": "1"}


def test_engine_failure_without_a_message() -> None:
    err = engine_failure(TokenDelta((), "error"))
    assert isinstance(err, EngineError) and err.status == 500
    assert err.message == "The engine failed this request."


def test_consumer_gone_aborts_the_engine() -> None:
    choice, engine = _choice([TokenDelta((0,)), TokenDelta((1,)), TokenDelta((), "stop")])

    async def first_only() -> None:
        gen = choice.events()
        await gen.__anext__()
        await gen.aclose()

    asyncio.run(first_only())
    assert engine.aborted == ["req-1"] and engine.closed


def test_timing_fields() -> None:
    choice, _ = _choice([TokenDelta((0,)), TokenDelta((1, 2)), TokenDelta((), "stop")])
    _events(choice)
    assert choice.first_token_at is not None and choice.last_token_at is not None
    assert choice.last_token_at >= choice.first_token_at
    assert len(choice.inter_token_s) == 2  # a 2-token delta adds two equal gaps
    assert choice.inter_token_s[0] == choice.inter_token_s[1] >= 0


def test_tool_call_sets_tool_calls_finish_and_content_none() -> None:
    choice, engine = _choice(
        [TokenDelta((4,)), TokenDelta((5, 6)), TokenDelta((7,), "stop")],
        tools=HERMES.stream(lambda: "call_1"),
    )
    events = _events(choice)
    assert events[-1].finish_reason == "tool_calls"
    assert [(c.id, c.name, c.arguments) for c in choice.tool_calls] == [("call_1", "f", "{}")]
    assert choice.content is None
    assert choice.text == "".join(WORDS[4:8])  # records keep the call text
    assert engine.aborted == []


def test_tool_call_cut_by_length_keeps_length() -> None:
    choice, _ = _choice(
        [TokenDelta((4,)), TokenDelta((5, 6)), TokenDelta((), "length")],
        tools=HERMES.stream(lambda: "call_1"),
    )
    events = _events(choice)
    assert events[-1].finish_reason == "length"


def test_plain_text_with_tools_is_content() -> None:
    choice, _ = _choice([TokenDelta((0, 1), "stop")], tools=HERMES.stream())
    events = _events(choice)
    assert events[-1].finish_reason == "stop"
    assert choice.content == "Hello world" and choice.tool_calls == []
