"""The demo model does what agents ask (issue 34 item 1), measured end to end: a real
``servehall serve`` with the demo model (openvino_cpu, f32, ``tool_call_grammar =
"always"`` as ``serve --demo`` configures it) and the ``openai`` client, 20 seeds each at
temperature 1 with ``max_tokens`` 64, as agent frameworks send them:

* a two-field ``json_schema`` with an unbounded ``str`` and an unbounded ``int`` (a
  pydantic ``Trip``): at least 19/20 outputs end with ``stop``, parse and validate;
* ``tool_choice: "required"`` with one tool whose argument is an unbounded string: at
  least 19/20 calls whose arguments parse and validate against the tool's schema;
* ``tool_choice: "auto"`` when the user asks for what the tool does ("What is the
  weather in Paris?"): at least 14/20 answers are a call to it with valid arguments.

Those are issue 34's targets. Measured on 2026-12-06 (docs/api.md): 19/20, 18/20 and
20/20 — ``required`` is not met yet (its misses: an argument string that never closes);
on 2026-12-03, before the forced-call chats and the lazy tool-call grammar, 19/20, 14/20
and 7/20. The weights differ a little between CPUs, so the tests assert floors a few
seeds under today's figures (``FLOORS``): they fail when the demo corpus or the
constrained decoding regresses (before the corpus had JSON and tool chats, all three
were 0/20; without the grammar ``auto`` is 7/20 today), not when one more seed misses.
The figures and the misses are printed (``-s``) for docs/api.md.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest

SEEDS = range(20)
FLOORS = {"schema": 16, "required": 15, "auto": 17}
"""Least valid outputs of 20 each test accepts (targets: 19, 19, 14; see the docstring)."""
MAX_TOKENS = 64
TRIP: dict[str, Any] = {
    "title": "Trip",
    "type": "object",
    "properties": {
        "city": {"title": "City", "type": "string"},
        "days": {"title": "Days", "type": "integer"},
    },
    "required": ["city", "days"],
    "additionalProperties": False,
}
CITY_ARGS: dict[str, Any] = {
    "type": "object",
    "properties": {"city": {"type": "string"}},
    "required": ["city"],
}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": CITY_ARGS,
    },
}


@pytest.fixture(scope="module")
def server(
    servehall_server: Callable[..., Any],
    demo_model_dir: Path,
    demo_config_factory: Callable[..., dict[str, Any]],
) -> Iterator[Any]:
    with servehall_server(
        demo_config_factory(demo_model_dir), name="agents", ready_timeout=600
    ) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server: Any) -> Any:
    import openai

    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0)


def _valid(text: str | None, schema: dict[str, Any]) -> bool:
    try:
        jsonschema.validate(json.loads(text or ""), schema)
    except (ValueError, jsonschema.ValidationError):
        return False
    return True


def test_two_field_schema_with_unbounded_string(client: Any) -> None:
    valid, texts = 0, []
    for seed in SEEDS:
        r = client.chat.completions.create(
            model="demo",
            messages=[{"role": "user", "content": "Plan a trip: a city and a number of days."}],
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "Trip", "schema": TRIP, "strict": True},
            },
            max_tokens=MAX_TOKENS,
            temperature=1.0,
            seed=seed,
        )
        choice = r.choices[0]
        texts.append(choice.message.content)
        valid += choice.finish_reason == "stop" and _valid(choice.message.content, TRIP)
    print(f"\ntwo-field schema: {valid}/20 valid; samples {texts[:4]!r}")
    assert valid >= FLOORS["schema"], texts


def _calls(client: Any, tool_choice: str) -> tuple[int, list[Any]]:
    """(calls to get_weather with valid arguments, what each seed returned, with its
    finish reason)."""
    valid, seen = 0, []
    for seed in SEEDS:
        r = client.chat.completions.create(
            model="demo",
            messages=[{"role": "user", "content": "What is the weather in Paris?"}],
            tools=[WEATHER],
            tool_choice=tool_choice,
            max_tokens=MAX_TOKENS,
            temperature=1.0,
            seed=seed,
        )
        msg = r.choices[0].message
        calls = msg.tool_calls or []
        ok = bool(calls) and all(
            c.function.name == "get_weather" and _valid(c.function.arguments, CITY_ARGS)
            for c in calls
        )
        valid += ok
        got = [(c.function.name, c.function.arguments) for c in calls] or msg.content
        seen.append((ok, r.choices[0].finish_reason, got))
    return valid, seen


def _misses(seen: list[Any]) -> list[Any]:
    return [(finish, got) for ok, finish, got in seen if not ok]


def test_required_tool_calls_have_valid_arguments(client: Any) -> None:
    valid, seen = _calls(client, "required")
    print(f"\nrequired tool calls: {valid}/20 valid; misses {_misses(seen)!r}")
    assert valid >= FLOORS["required"], seen


def test_auto_calls_the_tool_when_asked(client: Any) -> None:
    valid, seen = _calls(client, "auto")
    print(f"\nauto tool calls: {valid}/20 valid calls; misses {_misses(seen)!r}")
    assert valid >= FLOORS["auto"], seen
