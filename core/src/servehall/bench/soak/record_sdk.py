"""Record the request bodies that client libraries really send (run once, by hand).

Standalone on purpose (stdlib only, plus the library being recorded): run it with the
interpreter of any virtual environment that has the library installed, e.g.::

    python core/src/servehall/bench/soak/record_sdk.py openai OUT.json

It starts a capture server on 127.0.0.1 (a free port) that answers every POST with a
minimal OpenAI-shaped reply (JSON, or SSE when the body asks for ``stream``), drives the
library through the calls applications make, and writes ``{"library", "version",
"bodies": [{"name", "path", "body"}]}`` to ``OUT.json``. A library call that fails on
the canned reply is fine: the body it sent is what is recorded. The committed recordings
live in ``data/sdk_bodies_<library>.json`` and are replayed by ``servehall bench soak``.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Callable
from functools import partial
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

CAPTURED: list[dict[str, Any]] = []
_CURRENT = {"name": ""}


def _reply(body: dict[str, Any], path: str) -> tuple[bytes, str]:
    """The canned reply to ``body``: (bytes, content type)."""
    chat = path.endswith("/chat/completions")
    now = int(time.time())
    n = int(body.get("n") or 1) if isinstance(body.get("n"), int) else 1
    if chat:
        msg: dict[str, Any] = {"role": "assistant", "content": '{"city": "Paris"}'}
        choice = {"index": 0, "message": msg, "finish_reason": "stop", "logprobs": None}
        data: dict[str, Any] = {
            "id": "chatcmpl-capture",
            "object": "chat.completion",
            "created": now,
            "model": body.get("model", "demo"),
            "choices": [{**choice, "index": i} for i in range(n)],
            "usage": {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7},
        }
    else:
        data = {
            "id": "cmpl-capture",
            "object": "text_completion",
            "created": now,
            "model": body.get("model", "demo"),
            "choices": [
                {"index": i, "text": " Paris", "finish_reason": "stop", "logprobs": None}
                for i in range(n)
            ],
            "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
        }
    if not body.get("stream"):
        return json.dumps(data).encode(), "application/json"
    events = []
    for c in data["choices"]:
        if chat:
            delta = {"role": "assistant", "content": c["message"]["content"]}
            ch = {"index": c["index"], "delta": delta, "finish_reason": "stop", "logprobs": None}
            obj = "chat.completion.chunk"
        else:
            ch = {**c}
            obj = "text_completion"
        events.append({**data, "object": obj, "choices": [ch], "usage": None})
    events.append({**data, "object": obj, "choices": [], "usage": data["usage"]})
    text = "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"
    return text.encode(), "text/event-stream"


class _Handler(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        raw = self.rfile.read(int(self.headers.get("content-length") or 0))
        try:
            body = json.loads(raw)
        except ValueError:
            body = {"_raw": raw.decode("utf-8", "replace")}
        CAPTURED.append({"name": _CURRENT["name"], "path": self.path, "body": body})
        out, ctype = _reply(body if isinstance(body, dict) else {}, self.path)
        self.send_response(200)
        self.send_header("content-type", ctype)
        self.send_header("content-length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def do_GET(self) -> None:
        out = json.dumps({"object": "list", "data": [{"id": "demo", "object": "model"}]}).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def log_message(self, *args: Any) -> None:
        pass


def _drive(name: str, fn: Callable[[], Any]) -> None:
    _CURRENT["name"] = name
    try:
        res = fn()
        if hasattr(res, "__iter__") and not isinstance(res, dict | str | bytes):
            for _ in res:
                pass
    except Exception as exc:  # the canned reply may not satisfy the library
        print(f"  {name}: {type(exc).__name__} (body recorded)", file=sys.stderr)


WEATHER: Any = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"enum": ["C", "F"]}},
            "required": ["city"],
        },
    },
}


def record_openai(base: str) -> str:
    """Drive the ``openai`` SDK; returns its version."""
    import openai
    from pydantic import BaseModel

    class City(BaseModel):
        city: str
        population: int | None = None

    class Trip(BaseModel):
        origin: City
        stops: list[City]

    c: Any = openai.OpenAI(base_url=base + "/v1", api_key="sk-capture", max_retries=0)
    msgs: Any = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Weather in Paris?"},
    ]
    d = _drive
    d("chat", lambda: c.chat.completions.create(model="demo", messages=msgs, max_tokens=8))
    d(
        "chat_stream_usage",
        lambda: c.chat.completions.create(
            model="demo",
            messages=msgs,
            max_completion_tokens=8,
            stream=True,
            stream_options={"include_usage": True},
        ),
    )
    d(
        "chat_n2_stop_seed",
        lambda: c.chat.completions.create(
            model="demo",
            messages=msgs,
            n=2,
            stop=["\n", "."],
            seed=7,
            temperature=0.7,
            top_p=0.9,
            max_tokens=8,
            presence_penalty=0.1,
            frequency_penalty=0.1,
            user="u-1",
        ),
    )
    for choice in ("auto", "required", "none"):
        d(
            f"chat_tools_{choice}",
            partial(
                c.chat.completions.create,
                model="demo",
                messages=msgs,
                tools=[WEATHER],
                tool_choice=choice,
                max_tokens=16,
            ),
        )
    d(
        "chat_tools_named_parallel",
        lambda: c.chat.completions.create(
            model="demo",
            messages=msgs,
            tools=[WEATHER],
            tool_choice={"type": "function", "function": {"name": "get_weather"}},
            parallel_tool_calls=False,
            max_tokens=16,
        ),
    )
    d(
        "chat_tool_result_turn",
        lambda: c.chat.completions.create(
            model="demo",
            messages=[
                *msgs,
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
                {"role": "tool", "tool_call_id": "call_1", "content": "18C, sunny"},
            ],
            tools=[WEATHER],
            max_tokens=16,
        ),
    )
    d(
        "chat_pydantic_function_tool",
        lambda: c.chat.completions.create(
            model="demo",
            messages=msgs,
            tools=[openai.pydantic_function_tool(City)],
            max_tokens=16,
        ),
    )
    d(
        "chat_json_object",
        lambda: c.chat.completions.create(
            model="demo", messages=msgs, response_format={"type": "json_object"}, max_tokens=16
        ),
    )
    d(
        "chat_parse_pydantic",
        lambda: c.chat.completions.parse(
            model="demo", messages=msgs, response_format=Trip, max_tokens=24
        ),
    )
    d(
        "chat_logprobs",
        lambda: c.chat.completions.create(
            model="demo", messages=msgs, logprobs=True, top_logprobs=2, max_tokens=4
        ),
    )
    d(
        "chat_content_parts",
        lambda: c.chat.completions.create(
            model="demo",
            messages=[{"role": "user", "content": [{"type": "text", "text": "Hello there"}]}],
            max_tokens=8,
        ),
    )
    d("completion", lambda: c.completions.create(model="demo", prompt="Once upon", max_tokens=8))
    d(
        "completion_stream_n2",
        lambda: c.completions.create(
            model="demo",
            prompt="Once upon",
            max_tokens=8,
            n=2,
            stream=True,
            stream_options={"include_usage": True},
        ),
    )
    d(
        "completion_extra_body_guided",
        lambda: c.completions.create(
            model="demo",
            prompt="Pick one:",
            max_tokens=8,
            extra_body={"guided_choice": ["yes", "no"]},
        ),
    )
    return str(openai.__version__)


def record_instructor(base: str) -> str:
    """Drive ``instructor`` (tools mode and JSON-schema mode) over the openai SDK."""
    import instructor
    import openai
    from pydantic import BaseModel

    class City(BaseModel):
        city: str
        population: int

    raw: Any = openai.OpenAI(base_url=base + "/v1", api_key="sk-capture", max_retries=0)
    msgs: Any = [{"role": "user", "content": "Paris facts"}]
    for mode in (
        instructor.Mode.TOOLS,
        instructor.Mode.JSON_SCHEMA,
        instructor.Mode.JSON,
        instructor.Mode.MD_JSON,
    ):
        c: Any = instructor.from_openai(raw, mode=mode)
        _drive(
            f"extract_{mode.name.lower()}",
            partial(
                c.chat.completions.create,
                model="demo",
                response_model=City,
                messages=msgs,
                max_retries=0,
                max_tokens=32,
            ),
        )
    return str(instructor.__version__)


def record_pydantic_ai(base: str) -> str:
    """Drive ``pydantic-ai`` agents: plain text, a tool, structured output."""
    from importlib.metadata import version

    from pydantic import BaseModel
    from pydantic_ai import Agent
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    class City(BaseModel):
        city: str

    model = OpenAIChatModel("demo", provider=OpenAIProvider(base_url=base + "/v1", api_key="k"))
    plain = Agent(model, instructions="Be brief.")
    _drive("agent_text", lambda: plain.run_sync("Hi", model_settings={"max_tokens": 16}))
    tooled = Agent(model)

    @tooled.tool_plain
    def get_weather(city: str) -> str:
        """The weather in a city."""
        return "sunny"

    _drive("agent_tool", lambda: tooled.run_sync("Weather in Paris?"))
    typed = Agent(model, output_type=City)
    _drive("agent_output_type", lambda: typed.run_sync("Which city?"))
    _drive("agent_stream", lambda: _stream_pai(plain))
    return version("pydantic-ai-slim")


def _stream_pai(agent: Any) -> None:
    import asyncio

    async def go() -> None:
        async with agent.run_stream("Hi") as result:
            async for _ in result.stream_text():
                pass

    asyncio.run(go())


def record_langchain_openai(base: str) -> str:
    """Drive ``langchain-openai``'s ChatOpenAI: invoke, stream, tools, structured output."""
    from importlib.metadata import version

    from langchain_openai import ChatOpenAI
    from pydantic import BaseModel

    class City(BaseModel):
        """A city."""

        city: str

    llm = ChatOpenAI(model="demo", base_url=base + "/v1", api_key="k", max_retries=0, max_tokens=16)
    _drive("invoke", lambda: llm.invoke("Hi"))
    _drive("stream", lambda: list(llm.stream("Hi")))
    _drive("bind_tools", lambda: llm.bind_tools([City]).invoke("Which city?"))
    _drive(
        "structured_json_schema",
        lambda: llm.with_structured_output(City, method="json_schema").invoke("Which city?"),
    )
    _drive(
        "structured_function_calling",
        lambda: llm.with_structured_output(City, method="function_calling").invoke("City?"),
    )
    _drive(
        "structured_json_mode",
        lambda: llm.with_structured_output(City, method="json_mode").invoke("City as JSON"),
    )
    return version("langchain-openai")


def record_openai_agents(base: str) -> str:
    """Drive ``openai-agents`` (the Chat Completions model): text, a tool, typed output."""
    from importlib.metadata import version

    import openai
    from agents import (
        Agent,
        OpenAIChatCompletionsModel,
        Runner,
        function_tool,
        set_tracing_disabled,
    )
    from pydantic import BaseModel

    set_tracing_disabled(True)
    client = openai.AsyncOpenAI(base_url=base + "/v1", api_key="k", max_retries=0)
    model = OpenAIChatCompletionsModel(model="demo", openai_client=client)

    @function_tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        return "sunny"

    class City(BaseModel):
        city: str

    a = Agent(name="a", instructions="Be brief.", model=model)
    _drive("agent_text", lambda: Runner.run_sync(a, "Hi"))
    t = Agent(name="t", instructions="Use tools.", model=model, tools=[get_weather])
    _drive("agent_tool", lambda: Runner.run_sync(t, "Weather in Paris?"))
    o = Agent(name="o", model=model, output_type=City)
    _drive("agent_output_type", lambda: Runner.run_sync(o, "Which city?"))
    return version("openai-agents")


RECORDERS: dict[str, Callable[[str], str]] = {
    "openai": record_openai,
    "instructor": record_instructor,
    "pydantic_ai": record_pydantic_ai,
    "langchain_openai": record_langchain_openai,
    "openai_agents": record_openai_agents,
}


def main(argv: list[str]) -> int:
    """``record_sdk.py LIBRARY OUT.json``."""
    if len(argv) != 2 or argv[0] not in RECORDERS:
        print(f"usage: record_sdk.py {{{'|'.join(RECORDERS)}}} OUT.json", file=sys.stderr)
        return 2
    CAPTURED.clear()  # one recording per call, however many a process makes
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        version = RECORDERS[argv[0]](base)
    finally:
        server.shutdown()
    out = {"library": argv[0], "version": version, "bodies": CAPTURED}
    with open(argv[1], "w", encoding="utf-8") as fh:
        json.dump(out, fh, indent=1, sort_keys=True)
        fh.write("\n")
    print(f"{len(CAPTURED)} bodies from {argv[0]} {version} -> {argv[1]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
