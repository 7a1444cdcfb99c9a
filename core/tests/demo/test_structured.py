"""Tests of servehall.demo.structured: the JSON documents and tool chats of the demo
corpus — valid JSON, the spacing variants, bounded values, OpenAI-shaped tool chats."""

from __future__ import annotations

import json
import random
from typing import Any

from servehall.demo.structured import (
    CITIES,
    COLORS,
    INT_KEYS,
    JSON_REQUESTS,
    NAMES,
    STRING_KEYS,
    TOOLS,
    dump,
    forced_call_chat,
    json_chat,
    json_fields,
    json_object,
    place,
    short_string,
    small_int,
    tool_chat,
    tool_spec,
)


def test_short_strings_fit_their_key_and_stay_short() -> None:
    rng = random.Random(0)
    for _ in range(200):
        assert short_string(rng, "city") in CITIES
        assert short_string(rng, "name") in NAMES
        assert short_string(rng, "color") in COLORS
        assert 1 <= len(short_string(rng).split()) <= 6


def test_places_are_mostly_cities_and_always_short() -> None:
    rng = random.Random(11)
    places = [place(rng) for _ in range(400)]
    assert 0.65 < sum(p in CITIES for p in places) / 400 < 0.85
    assert any(p not in CITIES for p in places)
    assert all(1 <= len(p.split()) <= 6 for p in places)


def test_small_ints_are_bounded() -> None:
    rng = random.Random(1)
    values = [small_int(rng) for _ in range(1000)]
    assert all(0 <= v <= 100 or 1900 <= v <= 2030 for v in values)
    assert sum(1 <= v <= 30 for v in values) > 600  # mostly small


def test_json_fields_have_one_to_three_typed_keys() -> None:
    rng = random.Random(2)
    for _ in range(300):
        fields = json_fields(rng)
        assert 1 <= len(fields) <= 3
        for k, v in fields.items():
            assert (k in INT_KEYS and isinstance(v, int)) or (
                k in STRING_KEYS and isinstance(v, str)
            )


def test_dump_spacing_variants() -> None:
    rng = random.Random(3)
    texts = {dump({"a": 1, "b": "ü"}, rng) for _ in range(100)}
    assert texts == {'{"a": 1, "b": "ü"}', '{"a":1,"b":"ü"}'}


def test_json_objects_are_valid_and_sometimes_tool_calls() -> None:
    rng = random.Random(4)
    names = {t.name for t in TOOLS}
    kinds = set()
    for _ in range(400):
        value = json.loads(json_object(rng))
        if isinstance(value, dict):
            kinds.add("object")
        elif set(value[0]) == {"name", "parameters"}:
            kinds.add("calls")
            assert all(c["name"] in names and isinstance(c["parameters"], dict) for c in value)
        else:
            kinds.add("array")
            assert len(value) == 1 and isinstance(value[0], dict)
    assert kinds == {"object", "calls", "array"}


def test_json_chat_asks_for_json_and_answers_an_object() -> None:
    rng = random.Random(5)
    for _ in range(100):
        ask, answer = json_chat(rng)
        fields = json.loads(answer)
        assert isinstance(fields, dict) and 1 <= len(fields) <= 3
        keys = [*fields, "city", "name"]
        assert ask in {r.format(a=keys[0], b=keys[1]) for r in JSON_REQUESTS}


def test_tool_spec_is_openai_shaped() -> None:
    rng = random.Random(6)
    for tool in TOOLS:
        for _ in range(20):
            spec = tool_spec(tool, rng)
            assert spec["type"] == "function"
            fn: dict[str, Any] = spec["function"]
            assert fn["name"] == tool.name
            params = fn["parameters"]
            assert params["type"] == "object" and params["required"] == list(tool.params)
            assert {p: s["type"] for p, s in params["properties"].items()} == tool.params


def test_tool_chats_call_an_offered_tool_with_valid_arguments() -> None:
    rng = random.Random(7)
    prose = 0
    for _ in range(300):
        tools, messages = tool_chat(rng)
        offered = [t["function"]["name"] for t in tools]
        assert 1 <= len(offered) <= 3 and len(set(offered)) == len(offered)
        roles = [m["role"] for m in messages if m["role"] != "system"]
        if roles == ["user", "assistant"]:
            prose += 1
            continue
        assert roles == ["user", "assistant", "tool", "assistant"]
        call = messages[-3]["tool_calls"][0]["function"]
        assert call["name"] in offered
        spec = next(t for t in TOOLS if t.name == call["name"])
        assert set(json.loads(call["arguments"])) == set(spec.params)
    assert 20 < prose < 80  # one in six answered in prose


def test_eleven_tools_with_distinct_names_and_askable_arguments() -> None:
    assert len(TOOLS) == 11 and len({t.name for t in TOOLS}) == 11
    rng = random.Random(10)
    for tool in TOOLS:
        args, result, answer = tool.make(rng)
        assert {k: type(v).__name__ for k, v in args.items()} == {
            k: {"string": "str", "integer": "int"}[t] for k, t in tool.params.items()
        }
        assert result and answer
        for ask in tool.asks:
            assert ask.format(**args) != ask  # each ask names its arguments


def test_forced_call_chats_answer_with_the_required_call_array() -> None:
    rng = random.Random(8)
    for _ in range(300):
        tools, messages = forced_call_chat(rng)
        offered = [t["function"]["name"] for t in tools]
        assert 1 <= len(offered) <= 3
        assert [m["role"] for m in messages] == ["user", "assistant"]
        [call] = json.loads(messages[1]["content"])
        assert set(call) == {"name", "parameters"} and call["name"] in offered
        spec = next(t for t in TOOLS if t.name == call["name"])
        assert set(call["parameters"]) == set(spec.params)
        assert messages[0]["content"] in {a.format(**call["parameters"]) for a in spec.asks}


def test_deterministic_in_the_seed() -> None:
    assert forced_call_chat(random.Random(9)) == forced_call_chat(random.Random(9))
    assert tool_chat(random.Random(9)) == tool_chat(random.Random(9))
    assert json_object(random.Random(9)) == json_object(random.Random(9))
