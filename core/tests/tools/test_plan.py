"""``servehall.tools.plan``: which stream reads a choice and which constraint enforces the
tool choice (named, required, auto with strict tools or one call, auto under
``tool_call_grammar = "always"``, none)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from servehall.errors import InvalidRequestError
from servehall.structured.schema import NUMBER_BOUND
from servehall.tools.forced import NamedCallStream
from servehall.tools.parsers import HERMES
from servehall.tools.plan import ANY_OBJECT, TOOLS_CODE, FunctionTool, ToolGrammar, ToolPlan
from servehall.tools.scanner import JsonCallStream

WEATHER = FunctionTool(
    "weather",
    {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    description="Weather in a city",
)
CLOCK = FunctionTool("clock")


def _ids() -> str:
    return "call_x"


def test_function_tool_template_and_schema() -> None:
    assert WEATHER.template() == {
        "type": "function",
        "function": {
            "name": "weather",
            "description": "Weather in a city",
            "parameters": WEATHER.parameters,
        },
    }
    assert CLOCK.template() == {
        "type": "function",
        "function": {"name": "clock", "parameters": ANY_OBJECT},
    }
    assert CLOCK.schema == ANY_OBJECT and WEATHER.schema is WEATHER.parameters


def test_active_and_forced() -> None:
    assert ToolPlan((WEATHER,)).active and not ToolPlan((WEATHER,)).forced
    assert not ToolPlan((WEATHER,), "none").active
    assert not ToolPlan((), "auto").active
    assert ToolPlan((WEATHER,), "required").forced
    assert ToolPlan((WEATHER,), "named", "weather").forced
    assert not ToolPlan((), "required").forced


def test_streams_per_choice() -> None:
    named = ToolPlan((WEATHER,), "named", "weather").stream(HERMES, _ids)
    assert isinstance(named, NamedCallStream) and named.name == "weather"
    assert isinstance(ToolPlan((WEATHER,), "required").stream(HERMES), JsonCallStream)
    auto = ToolPlan((WEATHER,)).stream(HERMES, _ids)
    out = auto.feed('<tool_call>{"name": "weather", "arguments": {"city": "Oslo"}}</tool_call>')
    out2 = auto.finish()
    names = [d.name for d in out.calls + out2.calls if d.name]
    assert names == ["weather"]


def test_constraint_param() -> None:
    assert ToolPlan((WEATHER,), "required").constraint_param() == "tool_choice"
    assert ToolPlan((WEATHER,), "named", "weather").constraint_param() == "tool_choice"
    assert ToolPlan((WEATHER,), parallel=False).constraint_param() == "parallel_tool_calls"
    assert ToolPlan((WEATHER,)).constraint_param() == "tools"


def test_no_constraint_for_none_and_plain_auto() -> None:
    assert ToolPlan((WEATHER,), "none").constraint(HERMES) is None
    assert ToolPlan((WEATHER, CLOCK)).constraint(HERMES) is None


def test_named_constraint_is_the_checked_parameters() -> None:
    c = ToolPlan((CLOCK, WEATHER), "named", "weather").constraint(HERMES)
    assert c is not None and c.json_schema is not None
    assert json.loads(c.json_schema) == WEATHER.parameters
    num = FunctionTool("n", {"type": "object", "properties": {"k": {"type": "integer"}}})
    c = ToolPlan((num,), "named", "n").constraint(HERMES)
    assert c is not None and c.json_schema is not None
    assert json.loads(c.json_schema)["properties"]["k"]["maximum"] == NUMBER_BOUND


def test_required_schema() -> None:
    plan = ToolPlan((WEATHER, CLOCK), "required")
    schema = plan.required_schema()
    assert schema["type"] == "array" and schema["minItems"] == 1 and "maxItems" not in schema
    items = schema["items"]["anyOf"]
    assert [i["properties"]["name"]["enum"] for i in items] == [["weather"], ["clock"]]
    assert items[0]["properties"]["parameters"] == WEATHER.parameters
    assert items[1]["properties"]["parameters"] == ANY_OBJECT
    assert all(i["additionalProperties"] is False for i in items)
    assert "$defs" not in schema and "definitions" not in schema
    one = ToolPlan((WEATHER,), "required", parallel=False).required_schema()
    assert one["maxItems"] == 1
    c = plan.constraint(HERMES)
    assert c is not None and c.json_schema is not None
    assert json.loads(c.json_schema) == schema


def _with_defs(name: str, defs: dict[str, Any]) -> FunctionTool:
    return FunctionTool(
        name,
        {"type": "object", "properties": {"p": {"$ref": "#/$defs/Point"}}, "$defs": defs},
    )


def test_required_hoists_defs_and_refuses_conflicts() -> None:
    point = {"Point": {"type": "string"}}
    schema = ToolPlan(
        (_with_defs("a", point), _with_defs("b", point)), "required"
    ).required_schema()
    assert schema["$defs"] == point
    for item in schema["items"]["anyOf"]:
        assert "$defs" not in item["properties"]["parameters"]
    other = {"Point": {"type": "boolean"}}
    with pytest.raises(InvalidRequestError) as info:
        ToolPlan((_with_defs("a", point), _with_defs("b", other)), "required").required_schema()
    assert info.value.param == "tools" and info.value.code == TOOLS_CODE
    assert "$defs/Point" in info.value.message


def test_checked_schema_names_the_tool() -> None:
    bad = FunctionTool(
        "bad", {"type": "object", "properties": {"x": {"type": "string", "format": "zip"}}}
    )
    with pytest.raises(InvalidRequestError) as info:
        ToolPlan((WEATHER, bad), "required").constraint(HERMES)
    assert info.value.param == "tools[1].function.parameters"
    assert info.value.code == TOOLS_CODE


def _tag(plan: ToolPlan, grammar: ToolGrammar = "strict") -> dict[str, Any]:
    c = plan.constraint(HERMES, grammar)
    assert c is not None and c.structural_tag is not None and c.json_schema is None
    tag: dict[str, Any] = json.loads(c.structural_tag)
    return tag


def test_auto_structural_tag_for_one_call() -> None:
    tag = _tag(ToolPlan((WEATHER, CLOCK), parallel=False))
    fmt = tag["format"]
    assert tag["type"] == "structural_tag" and fmt["type"] == "triggered_tags"
    assert fmt["triggers"] == ["<tool_call>"]
    assert fmt["stop_after_first"] is True and fmt["at_least_one"] is False
    assert [t["begin"] for t in fmt["tags"]] == [
        '<tool_call>\n{"name": "weather", "arguments": ',
        '<tool_call>\n{"name": "clock", "arguments": ',
    ]
    assert all(t["end"] == "}\n</tool_call>" for t in fmt["tags"])
    # Not strict: any object.
    assert all(t["content"]["json_schema"] == ANY_OBJECT for t in fmt["tags"])


def test_auto_structural_tag_strict_tool_uses_its_schema() -> None:
    strict = FunctionTool("w", WEATHER.parameters, strict=True)
    fmt = _tag(ToolPlan((strict, CLOCK)))["format"]
    assert fmt["stop_after_first"] is False
    assert fmt["tags"][0]["content"]["json_schema"] == WEATHER.parameters
    assert fmt["tags"][1]["content"]["json_schema"] == ANY_OBJECT
    bad = FunctionTool("b", {"type": "object", "properties": {"x": {"not": {}}}}, strict=True)
    with pytest.raises(InvalidRequestError) as info:
        ToolPlan((CLOCK, bad)).constraint(HERMES)
    assert info.value.param == "tools[1].function.parameters"


def test_always_constrains_every_auto_call_by_its_schema() -> None:
    plan = ToolPlan((WEATHER, CLOCK))
    assert plan.constraint(HERMES) is None  # the default: plain auto is free text
    fmt = _tag(plan, "always")["format"]
    assert fmt["triggers"] == ["<tool_call>"] and fmt["at_least_one"] is False
    assert fmt["stop_after_first"] is False  # parallel calls stay allowed
    assert [t["begin"] for t in fmt["tags"]] == [
        '<tool_call>\n{"name": "weather", "arguments": ',
        '<tool_call>\n{"name": "clock", "arguments": ',
    ]
    # not strict, yet each tool's arguments follow its checked schema
    assert fmt["tags"][0]["content"]["json_schema"] == plan.checked_schema(0)
    assert fmt["tags"][0]["content"]["json_schema"]["required"] == ["city"]
    assert fmt["tags"][1]["content"]["json_schema"] == ANY_OBJECT
    one = _tag(ToolPlan((WEATHER,), parallel=False), "always")["format"]
    assert one["stop_after_first"] is True


def test_always_leaves_other_choices_alone() -> None:
    for plan in (
        ToolPlan((WEATHER,), "none"),
        ToolPlan((WEATHER,), "required"),
        ToolPlan((WEATHER,), "named", "weather"),
    ):
        assert plan.constraint(HERMES, "always") == plan.constraint(HERMES)


def test_always_falls_back_to_any_object_for_a_refused_non_strict_schema() -> None:
    odd = FunctionTool("odd", {"type": "object", "properties": {"x": {"not": {}}}})
    fmt = _tag(ToolPlan((WEATHER, odd)), "always")["format"]
    assert fmt["tags"][1]["content"]["json_schema"] == ANY_OBJECT
    strict = FunctionTool("odd", odd.parameters, strict=True)
    with pytest.raises(InvalidRequestError) as info:  # a strict tool's still is a 400
        ToolPlan((WEATHER, strict)).constraint(HERMES, "always")
    assert info.value.param == "tools[1].function.parameters"
