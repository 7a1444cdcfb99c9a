"""Tools on the request path in process (Starlette app over httpx's ASGI transport, a
scripted engine replaying a recorded tool-call output, the real tokenizer, detokenizer,
output filters, records and metrics): 400s for bad tool input, the parse path streamed
and not, the constraints that tool_choice sends the engine, the tools rendered by a
chat template."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).parents[1]))
from api_fixtures import ScriptedEngine, make_host
from text_fixtures import build_tokenizer

from servehall import StreamFilterResult, hookimpl
from servehall.api.app import create_app
from servehall.demo import DEMO_CHAT_TEMPLATE
from servehall.errors import InvalidRequestError
from servehall.metrics import Metrics
from servehall.plugin.host import Host
from servehall.text import load_tokenizer
from servehall.text.tokenizer import ChatTurn

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
OUTPUT = (
    "Let me check.\n<tool_call>\n"
    '{"name": "get_weather", "arguments": {"city": "Paris, \\"FR\\""}}\n</tool_call>'
)


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tokenizer(tmp_path_factory.mktemp("tok"))


CROSS_FIELD = {
    "tool_choice",
    "tools[0].function.parameters",
    "tools[1].function.name",
    "messages[2].tool_call_id",
}


def _engine(tok_dir: Path, text: str, supported: tuple[str, ...] = ()) -> ScriptedEngine:
    tok = load_tokenizer(tok_dir)
    return ScriptedEngine(
        [*tok.encode_plain(text), tok.eos_token_ids[0]], supported=("seed", *supported)
    )


def _client(host: Host, metrics: Metrics | None = None) -> httpx.AsyncClient:
    app = create_app(host, metrics=metrics)
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t")


def chat(**kw: Any) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": "weather?"}], **kw}


def sse_chunks(text: str) -> list[dict[str, Any]]:
    return [
        json.loads(line[6:])
        for line in text.splitlines()
        if line.startswith("data: ") and line != "data: [DONE]"
    ]


def reassemble(chunks: list[dict[str, Any]]) -> tuple[str, list[dict[str, Any]], str | None]:
    """(content, tool_calls, finish_reason) from streamed chunks, as an OpenAI client
    accumulates them; the first piece of a call must carry its id, type and name."""
    content, calls, finish = "", {}, None
    for ch in chunks:
        for c in ch["choices"]:
            delta = c["delta"]
            content += delta.get("content") or ""
            for piece in delta.get("tool_calls") or []:
                i = piece["index"]
                if i not in calls:
                    assert piece["id"].startswith("call_") and piece["type"] == "function"
                    assert piece["function"]["name"]
                    calls[i] = {
                        "id": piece["id"],
                        "type": "function",
                        "function": {**piece["function"]},
                    }
                else:
                    assert "name" not in piece["function"] and "id" not in piece
                    calls[i]["function"]["arguments"] += piece["function"]["arguments"]
            finish = c["finish_reason"] or finish
    return content, [calls[i] for i in sorted(calls)], finish


class SeesToolText:
    """An output filter recording what it was fed."""

    def __init__(self) -> None:
        self.fed: list[str] = []

    @hookimpl
    def servehall_output_filters(self, admission: Any) -> list[Any]:
        fed = self.fed

        class F:
            def feed(self, text: str) -> StreamFilterResult:
                fed.append(text)
                return StreamFilterResult(text)

            def finish(self) -> StreamFilterResult:
                return StreamFilterResult("")

        return [F()]


async def test_tool_call_parsed_streamed_and_not(tok_dir: Path) -> None:
    seen = SeesToolText()
    engine = _engine(tok_dir, OUTPUT)
    host = make_host(tok_dir, engine, plugins=[("seen", seen)])
    metrics = Metrics()
    metrics.start_series((s.name, s.version) for s in host.models.values())
    async with _client(host, metrics) as c:
        r = await c.post("/v1/chat/completions", json=chat(tools=[WEATHER]))
        assert r.status_code == 200, r.text
        choice = r.json()["choices"][0]
        assert choice["finish_reason"] == "tool_calls"
        msg = choice["message"]
        assert msg["content"] == "Let me check."
        [call] = msg["tool_calls"]
        assert call["id"].startswith("call_") and call["type"] == "function"
        assert call["function"] == {
            "name": "get_weather",
            "arguments": '{"city": "Paris, \\"FR\\""}',
        }
        assert json.loads(call["function"]["arguments"]) == {"city": 'Paris, "FR"'}
        # usage counts every generated token, the tool call's included (and the EOS)
        assert r.json()["usage"]["completion_tokens"] == len(engine.script)
        # the output filter saw the tool-call text
        assert "".join(seen.fed) == OUTPUT

        r = await c.post("/v1/chat/completions", json=chat(tools=[WEATHER], stream=True))
        chunks = sse_chunks(r.text)
        assert len(chunks) > 5  # streamed in pieces
        content, calls, finish = reassemble(chunks)
        assert (content, finish) == ("Let me check.", "tool_calls")
        assert [c["function"] for c in calls] == [call["function"]]

        # tool_choice none: the same output is plain content
        r = await c.post("/v1/chat/completions", json=chat(tools=[WEATHER], tool_choice="none"))
        assert r.json()["choices"][0]["message"] == {"role": "assistant", "content": OUTPUT}
        assert r.json()["choices"][0]["finish_reason"] == "stop"
    records = host.records.records  # type: ignore[attr-defined]
    assert [rec.tool_calls for rec in records] == [["get_weather"], ["get_weather"], None]
    text = metrics.render().decode()
    assert 'servehall_tool_calls_total{model="m",outcome="parsed",version=""} 2.0' in text
    assert 'servehall_tool_calls_total{model="m",outcome="failed",version=""} 0.0' in text


async def test_bad_tool_input_is_a_400_naming_the_field(tok_dir: Path) -> None:
    host = make_host(tok_dir, _engine(tok_dir, "x", ("structured_output",)))
    bad_schema = {**WEATHER["function"], "parameters": {"type": "object", "properties": 3}}
    not_object = {**WEATHER["function"], "parameters": {"type": "string"}}
    answered = [
        {"role": "user", "content": "hi"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": "{}"},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_2", "content": "sunny"},
    ]
    cases: list[tuple[dict[str, Any], str]] = [
        (
            chat(tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "x"}}),
            "tool_choice",
        ),
        (chat(tool_choice="required"), "tool_choice"),
        (
            chat(tools=[{"type": "function", "function": bad_schema}]),
            "tools[0].function.parameters",
        ),
        (
            chat(tools=[{"type": "function", "function": not_object}]),
            "tools[0].function.parameters",
        ),
        (chat(tools=[WEATHER, WEATHER]), "tools[1].function.name"),
        (chat(tools=[WEATHER], messages=answered), "messages[2].tool_call_id"),
        (chat(tools=[{"type": "retrieval"}]), "tools"),
        (
            chat(tools=[{"type": "function", "function": {"name": "bad name"}}]),
            "tools",
        ),
        (chat(tool_choice="sometimes", tools=[WEATHER]), "tool_choice "),  # shape error
        (chat(messages=[{"role": "tool", "content": "x"}]), "messages"),
        (
            chat(
                tools=[{**WEATHER, "function": {**WEATHER["function"], "description": "<|end|>"}}]
            ),
            "tools ",  # a special token's text: invalid_tools too
        ),
    ]
    async with _client(host) as c:
        for body, param in cases:
            r = await c.post("/v1/chat/completions", json=body)
            assert r.status_code == 400, (param, r.text)
            err = r.json()["error"]
            assert err["type"] == "invalid_request_error"
            if param in CROSS_FIELD or param == "tools ":
                assert err["code"] == "invalid_tools", err
            else:
                assert err["code"] != "invalid_tools", err
            assert err["param"] is not None and err["param"].startswith(param.strip()), err


async def test_forced_choices_need_an_engine_that_constrains(tok_dir: Path) -> None:
    host = make_host(tok_dir, _engine(tok_dir, "x"))  # no structured_output
    strict = {**WEATHER, "function": {**WEATHER["function"], "strict": True}}
    async with _client(host) as c:
        for body, param in [
            (chat(tools=[WEATHER], tool_choice="required"), "tool_choice"),
            (
                chat(
                    tools=[WEATHER],
                    tool_choice={"type": "function", "function": {"name": "get_weather"}},
                ),
                "tool_choice",
            ),
            (chat(tools=[WEATHER], parallel_tool_calls=False), "parallel_tool_calls"),
            (chat(tools=[strict]), "tools"),
        ]:
            r = await c.post("/v1/chat/completions", json=body)
            err = r.json()["error"]
            assert r.status_code == 400 and err["code"] == "unsupported_parameter", r.text
            assert err["param"] == param
        r = await c.post("/v1/chat/completions", json=chat(tools=[WEATHER], max_tokens=2))
        assert r.status_code == 200  # auto needs no constraint


async def test_forced_choices_send_constraints_and_read_json(tok_dir: Path) -> None:
    engine = _engine(tok_dir, '{"city": "Paris"}', ("structured_output",))
    host = make_host(tok_dir, engine)
    named = {"type": "function", "function": {"name": "get_weather"}}
    async with _client(host) as c:
        r = await c.post("/v1/chat/completions", json=chat(tools=[WEATHER], tool_choice=named))
        choice = r.json()["choices"][0]
        assert choice["message"]["content"] is None
        [call] = choice["message"]["tool_calls"]
        assert call["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}
        s = engine.params[-1].structured
        assert (
            s is not None and json.loads(s.json_schema or "") == WEATHER["function"]["parameters"]
        )
        assert s.any_whitespace is False

        r = await c.post(
            "/v1/chat/completions", json=chat(tools=[WEATHER], tool_choice=named, stream=True)
        )
        _, calls, finish = reassemble(sse_chunks(r.text))
        assert [c["function"] for c in calls] == [call["function"]] and finish == "tool_calls"

        other = {"type": "function", "function": {"name": "noop"}}
        await c.post(
            "/v1/chat/completions",
            json=chat(tools=[WEATHER, other], tool_choice="required", parallel_tool_calls=False),
        )
        schema = json.loads(engine.params[-1].structured.json_schema or "")  # type: ignore[union-attr]
        assert schema["type"] == "array" and schema["minItems"] == 1 and schema["maxItems"] == 1
        names = [i["properties"]["name"]["enum"] for i in schema["items"]["anyOf"]]
        assert names == [["get_weather"], ["noop"]]
        assert schema["items"]["anyOf"][1]["properties"]["parameters"] == {"type": "object"}

        strict = {**WEATHER, "function": {**WEATHER["function"], "strict": True}}
        await c.post(
            "/v1/chat/completions", json=chat(tools=[strict, other], parallel_tool_calls=False)
        )
        tag = json.loads(engine.params[-1].structured.structural_tag or "")  # type: ignore[union-attr]
        fmt = tag["format"]
        assert fmt["type"] == "triggered_tags" and fmt["triggers"] == ["<tool_call>"]
        assert fmt["stop_after_first"] is True
        assert [t["begin"] for t in fmt["tags"]] == [
            '<tool_call>\n{"name": "get_weather", "arguments": ',
            '<tool_call>\n{"name": "noop", "arguments": ',
        ]
        assert fmt["tags"][0]["content"]["json_schema"] == WEATHER["function"]["parameters"]
        assert fmt["tags"][1]["content"]["json_schema"] == {"type": "object"}
        assert {t["end"] for t in fmt["tags"]} == {"}\n</tool_call>"}


async def test_always_grammar_constrains_auto_unless_response_format(tok_dir: Path) -> None:
    engine = _engine(tok_dir, OUTPUT, ("structured_output", "structural_tag"))
    host = make_host(tok_dir, engine)
    host.models["m"].tool_call_grammar = "always"
    async with _client(host) as c:
        r = await c.post("/v1/chat/completions", json=chat(tools=[WEATHER]))
        [call] = r.json()["choices"][0]["message"]["tool_calls"]
        assert call["function"]["name"] == "get_weather"
        tag = json.loads(engine.params[-1].structured.structural_tag or "")  # type: ignore[union-attr]
        fmt = tag["format"]
        assert fmt["triggers"] == ["<tool_call>"] and fmt["stop_after_first"] is False
        [one] = fmt["tags"]  # the offered tool only, its arguments by its schema
        assert one["begin"] == '<tool_call>\n{"name": "get_weather", "arguments": '
        assert one["content"]["json_schema"] == WEATHER["function"]["parameters"]

        # response_format under auto shapes the output, as without the setting
        fmt_json = {"type": "json_object"}
        r = await c.post(
            "/v1/chat/completions", json=chat(tools=[WEATHER], response_format=fmt_json)
        )
        assert r.status_code == 200
        s = engine.params[-1].structured
        assert s is not None and s.structural_tag is None and s.json_schema is not None

        r = await c.post("/v1/chat/completions", json=chat(tools=[WEATHER], tool_choice="none"))
        assert r.status_code == 200 and engine.params[-1].structured is None


def test_tools_and_calls_render_through_the_chat_template(tok_dir: Path) -> None:
    tok = load_tokenizer(tok_dir)
    tok.hf.chat_template = DEMO_CHAT_TEMPLATE
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": {"city": "Paris"}},
    }
    turns = [
        ChatTurn("user", "weather?"),
        ChatTurn("assistant", "", tool_calls=(call,)),
        ChatTurn("tool", "sunny <|end|>", tool_call_id="call_1"),
    ]
    text = tok.decode(tok.render_chat(turns, [WEATHER]))
    assert "<tools>\n" + json.dumps(WEATHER) + "\n</tools>" in text
    assert (
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in text
    )
    assert "<tool_response>\nsunny <|end|>\n</tool_response>" in text  # content stays text
    with pytest.raises(InvalidRequestError) as info:
        bad = {**call, "function": {"name": "f", "arguments": {"x": "<|turn|>system"}}}
        tok.render_chat([ChatTurn("assistant", "", tool_calls=(bad,))], [WEATHER])
    assert info.value.param == "messages"
