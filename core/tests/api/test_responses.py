"""``/v1/responses`` in process (Starlette app over httpx's ASGI transport, a scripted
engine replaying a recorded output, the real tokenizer, chat template, tool-call reader,
records and a real SQLite database for stored responses): the translation both ways,
the event sequence, stored responses and their owner, and 400s naming the Responses
field."""

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

from servehall import hookimpl
from servehall.admission.principal import Policy, Principal
from servehall.api.app import create_app
from servehall.bench.soak.clients import _usage
from servehall.bench.soak.corpus import hostile_shapes
from servehall.bench.soak.mix import Mix
from servehall.plugin.host import Host
from servehall.text import load_tokenizer

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
CALL_OUTPUT = (
    "Let me check.\n<tool_call>\n"
    '{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
)


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tokenizer(tmp_path_factory.mktemp("tok"))


class HeaderAuth:
    """Authenticates ``x-who: <id>`` as principal ``<id>`` (the owner of its responses)."""

    @hookimpl
    def servehall_authenticate(self, host: Host, request: Any) -> Principal:
        who = request.headers.get("x-who", "alice")
        if who == "admin-only":  # a credential without the inference scope
            return Principal(id=who, tenant="t", policy=Policy(scopes=frozenset({"admin"})))
        return Principal(id=who, tenant="t", policy=Policy())


def _host(tok_dir: Path, tmp_path: Path, text: str) -> Host:
    tok = load_tokenizer(tok_dir)
    engine = ScriptedEngine(
        [*tok.encode_plain(text), tok.eos_token_ids[0]],
        supported=("seed", "top_p", "structured_output"),
    )
    db = f"sqlite+aiosqlite:///{tmp_path / 'db.sqlite'}"
    return make_host(
        tok_dir,
        engine,
        plugins=[("header-auth", HeaderAuth())],
        settings={"database": {"url": db, "auto_migrate": True}},
    )


def _client(host: Host, who: str = "alice") -> httpx.AsyncClient:
    app = create_app(host)
    return httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://t", headers={"x-who": who}
    )


def _events(text: str) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for block in text.strip().split("\n\n"):
        lines = block.split("\n")
        assert lines[0].startswith("event: ") and lines[1].startswith("data: "), block
        data = json.loads(lines[1][6:])
        assert data["type"] == lines[0][7:]
        out.append((data["type"], data))
    return out


# --- the route -------------------------------------------------------------------------


async def test_text_response_and_its_record(tok_dir: Path, tmp_path: Path) -> None:
    host = _host(tok_dir, tmp_path, "Hello there")
    async with _client(host) as c:
        r = await c.post(
            "/v1/responses",
            json={"model": "m", "input": "hi", "instructions": "Be kind.", "metadata": {"a": "b"}},
        )
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["id"].startswith("resp_") and body["object"] == "response"
        assert body["status"] == "completed" and body["metadata"] == {"a": "b"}
        [msg] = body["output"]
        assert msg["type"] == "message" and msg["role"] == "assistant"
        assert msg["content"][0]["type"] == "output_text"
        assert msg["content"][0]["text"] == "Hello there"
        usage = body["usage"]
        assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]
        # the chat template saw the instructions first
        engine = host.models["m"].engine
        prompt = load_tokenizer(tok_dir).decode(engine.prompts[-1])  # type: ignore[attr-defined]
        assert prompt.index("Be kind.") < prompt.index("hi")
        r = await c.post(
            "/v1/responses", json={"model": "m", "input": "hi", "max_output_tokens": 2}
        )
        assert r.json()["status"] == "incomplete"
        assert r.json()["incomplete_details"] == {"reason": "max_output_tokens"}
    records = host.records.records  # type: ignore[attr-defined]
    assert [rec.endpoint for rec in records] == ["/v1/responses"] * 2
    assert records[0].request_id == body["id"]
    assert (records[0].prompt_tokens, records[0].completion_tokens) == (
        usage["input_tokens"],
        usage["output_tokens"],
    )


async def test_function_call_streamed_and_not(tok_dir: Path, tmp_path: Path) -> None:
    host = _host(tok_dir, tmp_path, CALL_OUTPUT)
    req = {"model": "m", "input": "weather in Paris?", "tools": [TOOL], "store": False}
    async with _client(host) as c:
        r = await c.post("/v1/responses", json=req)
        assert r.status_code == 200, r.text
        msg, call = r.json()["output"]
        assert msg["content"][0]["text"] == "Let me check."
        assert call["type"] == "function_call" and call["name"] == "get_weather"
        assert call["call_id"].startswith("call_") and call["id"].startswith("fc_")
        assert json.loads(call["arguments"]) == {"city": "Paris"}

        r = await c.post("/v1/responses", json={**req, "stream": True})
        assert r.headers["content-type"].startswith("text/event-stream")
        events = _events(r.text)
        kinds = [k for k, _ in events]
        assert [e["sequence_number"] for _, e in events] == list(range(len(events)))
        assert kinds[:4] == [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.content_part.added",
        ]
        assert kinds[-1] == "response.completed"
        i = kinds.index("response.output_text.done")
        assert kinds[i : i + 4] == [
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.output_item.added",
        ]
        deltas = "".join(e["delta"] for k, e in events if k == "response.output_text.delta")
        assert deltas == "Let me check."
        args = "".join(
            e["delta"] for k, e in events if k == "response.function_call_arguments.delta"
        )
        [done] = [e for k, e in events if k == "response.function_call_arguments.done"]
        assert json.loads(args) == {"city": "Paris"} and done["arguments"] == args
        final = events[-1][1]["response"]
        assert [o["type"] for o in final["output"]] == ["message", "function_call"]
        assert final["usage"]["output_tokens"] > 0


async def test_follow_up_with_function_call_output(tok_dir: Path, tmp_path: Path) -> None:
    host = _host(tok_dir, tmp_path, "It is sunny.")
    async with _client(host) as c:
        r = await c.post(
            "/v1/responses",
            json={
                "model": "m",
                "tools": [TOOL],
                "input": [
                    {"role": "user", "content": "weather?"},
                    {
                        "type": "function_call",
                        "call_id": "call_9",
                        "name": "get_weather",
                        "arguments": '{"city":"Paris"}',
                    },
                    {"type": "function_call_output", "call_id": "call_9", "output": "sunny"},
                ],
            },
        )
        assert r.status_code == 200, r.text
        assert r.json()["output"][0]["content"][0]["text"] == "It is sunny."
        engine = host.models["m"].engine
        prompt = load_tokenizer(tok_dir).decode(engine.prompts[-1])  # type: ignore[attr-defined]
        assert prompt.index("weather?") < prompt.index("sunny")


async def test_store_previous_get_delete_and_owner(tok_dir: Path, tmp_path: Path) -> None:
    host = _host(tok_dir, tmp_path, "Hello there")
    async with _client(host) as c:
        first = (await c.post("/v1/responses", json={"model": "m", "input": "one"})).json()
        assert first["store"] is True
        got = await c.get(f"/v1/responses/{first['id']}")
        assert got.status_code == 200 and got.json() == first
        r = await c.post(
            "/v1/responses",
            json={"model": "m", "input": "two", "previous_response_id": first["id"]},
        )
        assert r.status_code == 200, r.text
        assert r.json()["previous_response_id"] == first["id"]
        engine = host.models["m"].engine
        prompt = load_tokenizer(tok_dir).decode(engine.prompts[-1])  # type: ignore[attr-defined]
        assert prompt.index("one") < prompt.index("Hello there") < prompt.index("two")
        # not stored: not found
        r = await c.post("/v1/responses", json={"model": "m", "input": "x", "store": False})
        assert (await c.get(f"/v1/responses/{r.json()['id']}")).status_code == 404
        r = await c.post(
            "/v1/responses",
            json={"model": "m", "input": "x", "previous_response_id": r.json()["id"]},
        )
        assert r.status_code == 404 and r.json()["error"]["param"] == "previous_response_id"
    async with _client(host, "mallory") as c:
        assert (await c.get(f"/v1/responses/{first['id']}")).status_code == 404
        assert (await c.delete(f"/v1/responses/{first['id']}")).status_code == 404
    async with _client(host, "admin-only") as c:
        for r in (
            await c.get(f"/v1/responses/{first['id']}"),
            await c.delete(f"/v1/responses/{first['id']}"),
            await c.post("/v1/responses", json={"model": "m", "input": "x"}),
        ):
            assert r.status_code == 403 and r.json()["error"]["code"] == "insufficient_scope"
    async with _client(host) as c:
        r = await c.delete(f"/v1/responses/{first['id']}")
        assert r.json() == {"id": first["id"], "object": "response.deleted", "deleted": True}
        assert (await c.get(f"/v1/responses/{first['id']}")).status_code == 404


BAD: list[tuple[dict[str, Any], str]] = [
    ({"reasoning": {"effort": "high"}}, "reasoning"),
    ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
    ({"tools": [{"type": "file_search", "vector_store_ids": []}]}, "tools[0].type"),
    ({"tool_choice": {"type": "web_search_preview"}}, "tool_choice"),
    ({"background": True}, "background"),
    ({"include": ["message.output_text.logprobs"]}, "include"),
    ({"conversation": "conv_1"}, "conversation"),
    ({"truncation": "auto"}, "truncation"),
    (
        {"input": [{"role": "user", "content": [{"type": "input_image"}]}]},
        "input[0].content[0].type",
    ),
    ({"input": [{"type": "reasoning", "summary": []}]}, "input[0].type"),
    ({"input": []}, "input"),
    ({"input": None}, "input"),
    ({"max_output_tokens": 0}, "max_output_tokens"),
    ({"temperature": 3}, "temperature"),
    ({"metadata": {"k": 1}}, "metadata"),
    ({"tools": [{**TOOL, "parameters": {"type": "array"}}]}, "tools[0].parameters"),
    ({"tool_choice": "required"}, "tool_choice"),
    (
        {"text": {"format": {"type": "json_schema", "name": "bad name!", "schema": {}}}},
        "text.format.name",
    ),
    (
        {"input": [{"type": "function_call_output", "call_id": "nope", "output": "x"}]},
        "input",
    ),
]


async def test_bad_input_is_a_400_naming_the_responses_field(tok_dir: Path, tmp_path: Path) -> None:
    host = _host(tok_dir, tmp_path, "x")
    async with _client(host) as c:
        for extra, param in BAD:
            r = await c.post("/v1/responses", json={"model": "m", "input": "hi", **extra})
            assert r.status_code == 400, (extra, r.text)
            assert r.json()["error"]["param"] == param, (extra, r.json())
        r = await c.post("/v1/responses", json={"model": "nope", "input": "hi"})
        assert r.status_code == 404
    assert all(rec.status_code in (400, 404) for rec in host.records.records)  # type: ignore[attr-defined]


async def test_soak_shapes(tok_dir: Path, tmp_path: Path) -> None:
    """The soak's Responses shapes: hostile ones are 4xx envelopes, valid ones 200s whose
    usage, as the soak reads it (JSON or the stream's last event), is the record's."""
    host = _host(tok_dir, tmp_path, CALL_OUTPUT)
    hostile = [s for s in hostile_shapes("m") if s.path == "/v1/responses"]
    valid = [s for s in Mix("m", schemas=1).categories["valid"] if s.path == "/v1/responses"]
    assert len(hostile) >= 10 and len(valid) >= 5
    async with _client(host) as c:
        for s in hostile:
            r = await c.post(s.path, content=s.content(), headers={"content-type": s.content_type})
            assert r.status_code in (400, 404), (s.name, r.status_code, r.text)
            assert set(r.json()["error"]) == {"message", "type", "param", "code"}
        told: dict[str, tuple[int, int] | None] = {}
        for s in valid:
            r = await c.post(s.path, content=s.content(), headers={"content-type": s.content_type})
            assert r.status_code == 200, (s.name, r.text)
            if s.stream:
                usage = None
                for block in r.text.strip().split("\n\n"):
                    usage = _usage(json.loads(block.split("\ndata: ", 1)[1])) or usage
            else:
                usage = _usage(r.json())
            told[r.headers["x-request-id"]] = usage
    records = {rec.request_id: rec for rec in host.records.records}  # type: ignore[attr-defined]
    for rid, usage in told.items():
        assert usage == (records[rid].prompt_tokens, records[rid].completion_tokens), rid


async def test_store_on_sqlite_and_postgresql(migrated: str) -> None:
    """The store on both databases: owner-only reads and deletes, and retention (an
    expired row is invisible, then purged by the next write)."""
    from servehall.config.settings import Settings
    from servehall.responses.store import ResponseStore

    body = {"id": "resp_a", "model": "m", "output": [], "usage": None}
    items = [{"type": "message", "role": "user", "content": "hi \u00e9\U0001f600"}]
    store = ResponseStore(Settings(database={"url": migrated}))
    try:
        await store.put("alice", body, items)
        got = await store.get("resp_a", "alice")
        assert got is not None and got.body == body and got.input_items == items
        assert await store.get("resp_a", "mallory") is None
        assert not await store.remove("resp_a", "mallory")
        assert await store.remove("resp_a", "alice")
        assert await store.get("resp_a", "alice") is None
    finally:
        await store.close()
    short = ResponseStore(Settings(database={"url": migrated}, responses={"retention_days": 1e-9}))
    try:
        await short.put("alice", {**body, "id": "resp_b"}, items)
        assert await short.get("resp_b", "alice") is None  # expired already
        await short.put("alice", {**body, "id": "resp_c"}, items)  # purges resp_b
        engine = await short.engine()
        async with engine.connect() as conn:
            from sqlalchemy import text

            ids = (await conn.execute(text("SELECT id FROM response_object"))).scalars().all()
        assert ids == ["resp_c"]
    finally:
        await short.close()
