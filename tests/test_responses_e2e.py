"""``/v1/responses`` against a real ``servehall serve`` (Hypercorn, the demo model, a SQLite
records database) with the official ``openai`` client: text, instructions, a required
function call and its ``function_call_output`` follow-up, ``text.format`` json_schema,
streaming through the SDK's event parser, ``store`` / ``previous_response_id`` / GET /
DELETE, 400s naming the field, and one ``request_log`` row per request with the usage
the response reported. openai-agents' default Responses model is run in CI by
``tests/test_frameworks_e2e.py`` (its own pinned environment).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from servehall.db.testing import wait_rows
from tests.conftest import sql_records

TRIP: dict[str, Any] = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
    "required": ["city", "days"],
    "additionalProperties": False,
}
WEATHER: dict[str, Any] = {
    "type": "function",
    "name": "get_weather",
    "description": "Current weather in a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}


@pytest.fixture(scope="module")
def served(
    tmp_path_factory: pytest.TempPathFactory,
    servehall_server: Callable[..., Any],
    demo_model_dir: Path,
    demo_config_factory: Callable[..., dict[str, Any]],
) -> Iterator[tuple[Any, str]]:
    url, records = sql_records(tmp_path_factory.mktemp("resp"))
    cfg = demo_config_factory(
        demo_model_dir,
        **records,
    )
    with servehall_server(cfg, name="responses", ready_timeout=600) as srv:
        yield srv, url


@pytest.fixture(scope="module")
def client(served: tuple[Any, str]) -> Any:
    import openai

    return openai.OpenAI(base_url=served[0].base_url + "/v1", api_key="unused", max_retries=0)


def _rows(url: str, ids: list[str], timeout: float = 20.0) -> list[Any]:
    """The ``request_log`` rows of ``ids`` (waits until all are written)."""
    marks = ", ".join(f"'{i}'" for i in ids)
    sql = (
        "SELECT request_id, endpoint, status_code, prompt_tokens, completion_tokens "
        f"FROM request_log WHERE request_id IN ({marks})"
    )
    return wait_rows(url, sql, len(ids), timeout)


def test_text_and_its_one_record(client: Any, served: tuple[Any, str]) -> None:
    r = client.responses.create(model="demo", input="hi", max_output_tokens=8)
    assert r.id.startswith("resp_") and r.object == "response"
    assert r.status in ("completed", "incomplete")
    assert isinstance(r.output_text, str) and r.output[0].type == "message"
    assert r.usage.output_tokens <= 8
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    r2 = client.responses.create(
        model="demo", input="hi", instructions="Answer in one word.", max_output_tokens=8
    )
    assert r2.instructions == "Answer in one word."
    assert r2.usage.input_tokens > r.usage.input_tokens  # the instructions are in the prompt
    rows = _rows(served[1], [r.id, r2.id])
    assert sorted((row[0], row[1], row[2], row[3], row[4]) for row in rows) == sorted(
        (x.id, "/v1/responses", 200, x.usage.input_tokens, x.usage.output_tokens) for x in (r, r2)
    )


def test_required_function_call_then_its_output(client: Any) -> None:
    question = "What is the weather in Paris?"
    r = client.responses.create(
        model="demo",
        input=question,
        tools=[WEATHER],
        tool_choice="required",
        parallel_tool_calls=False,
        max_output_tokens=64,
        temperature=0,
        store=False,
    )
    [call] = [o for o in r.output if o.type == "function_call"]
    assert call.name == "get_weather" and call.call_id.startswith("call_")
    assert isinstance(json.loads(call.arguments), dict)
    follow = client.responses.create(
        model="demo",
        input=[
            {"role": "user", "content": question},
            {
                "type": "function_call",
                "call_id": call.call_id,
                "name": call.name,
                "arguments": call.arguments,
            },
            {"type": "function_call_output", "call_id": call.call_id, "output": "sunny, 21 C"},
        ],
        tools=[WEATHER],
        tool_choice="none",
        max_output_tokens=16,
        store=False,
    )
    assert follow.output[0].type == "message" and isinstance(follow.output_text, str)


def test_json_schema_output_parses(client: Any) -> None:
    r = client.responses.create(
        model="demo",
        input="Plan a trip: a city and a number of days.",
        text={"format": {"type": "json_schema", "name": "Trip", "schema": TRIP, "strict": True}},
        max_output_tokens=64,
        temperature=0,
        store=False,
    )
    assert r.status == "completed", r.output_text
    jsonschema.validate(json.loads(r.output_text), TRIP)
    assert r.text.format.type == "json_schema"


def test_stream_through_the_sdk(client: Any) -> None:
    with client.responses.stream(
        model="demo", input="Tell me a story.", max_output_tokens=16, store=False
    ) as stream:
        events = list(stream)
        if events[-1].type == "response.completed":  # the SDK's final needs "completed"
            assert stream.get_final_response().output_text == events[-1].response.output_text
    final = events[-1].response
    kinds = [e.type for e in events]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-4:-1] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
    ]
    assert kinds[-1] in ("response.completed", "response.incomplete")
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == final.output_text
    assert final.usage is not None and final.usage.output_tokens > 0


def test_stream_with_create(client: Any) -> None:
    events = list(
        client.responses.create(
            model="demo",
            input="weather in Paris?",
            tools=[WEATHER],
            tool_choice="required",
            parallel_tool_calls=False,
            max_output_tokens=64,
            temperature=0,
            stream=True,
            store=False,
        )
    )
    kinds = [e.type for e in events]
    assert "response.function_call_arguments.delta" in kinds
    dones = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert len(dones) == 1
    for done in dones:  # the call's deltas joined
        args = "".join(
            e.delta
            for e in events
            if e.type == "response.function_call_arguments.delta" and e.item_id == done.item_id
        )
        assert done.arguments == args and isinstance(json.loads(args), dict)
    final = events[-1].response
    calls = [o for o in final.output if o.type == "function_call"]
    assert [c.arguments for c in calls] == [d.arguments for d in dones]


def test_store_previous_get_delete(client: Any) -> None:
    import openai

    first = client.responses.create(model="demo", input="My name is Ada.", max_output_tokens=8)
    assert first.store is True
    got = client.responses.retrieve(first.id)
    assert got.id == first.id and got.output_text == first.output_text
    second = client.responses.create(
        model="demo",
        input="What is my name?",
        previous_response_id=first.id,
        max_output_tokens=8,
    )
    assert second.previous_response_id == first.id
    # the conversation before it is in the prompt
    assert second.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens
    client.responses.delete(first.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(first.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.create(
            model="demo", input="x", previous_response_id=first.id, max_output_tokens=4
        )


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"reasoning": {"effort": "low"}}, "reasoning"),
        ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
        ({"background": True}, "background"),
        ({"include": ["message.output_text.logprobs"]}, "include"),
        ({"max_output_tokens": 0}, "max_output_tokens"),
        ({"tool_choice": "required"}, "tool_choice"),
    ],
)
def test_bad_input_is_a_400_naming_the_param(
    client: Any, extra: dict[str, Any], param: str
) -> None:
    import openai

    with pytest.raises(openai.BadRequestError) as err:
        client.responses.create(model="demo", input="hi", **extra)
    assert err.value.status_code == 400
    assert err.value.body["param"] == param  # type: ignore[index]
