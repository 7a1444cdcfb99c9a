"""Tests of servehall.engines.onnxruntime.guidance: constraints as ONNX Runtime GenAI's
``set_guidance(type, data)`` arguments (strict objects, bounded whitespace, escaped
choices) and the constraints it refuses."""

from __future__ import annotations

import json
import re

import pytest

from servehall.engines.contract import StructuredConstraint
from servehall.engines.onnxruntime.guidance import GuidanceUnsupported, escape_regex, guidance_of

SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string"},
        "stops": {
            "type": "array",
            "items": {"type": "object", "properties": {"name": {"type": "string"}}},
        },
        "extra": {
            "type": "object",
            "properties": {"k": {"type": "integer"}},
            "additionalProperties": True,
        },
    },
    "required": ["city"],
}


def _schema(**kw: object) -> dict[str, object]:
    kind, data = guidance_of(StructuredConstraint(json_schema=json.dumps(SCHEMA), **kw))  # type: ignore[arg-type]
    assert kind == "json_schema"
    out: dict[str, object] = json.loads(data)
    return out


def test_objects_become_strict_unless_they_say_otherwise() -> None:
    schema = _schema()
    assert schema["additionalProperties"] is False
    props = schema["properties"]
    assert isinstance(props, dict)
    assert props["stops"]["items"]["additionalProperties"] is False  # nested too
    # an explicit choice is kept (as the bounded "any JSON value" it allows)
    assert props["extra"]["additionalProperties"] == {"$ref": "#/$defs/servehall_any"}
    assert "additionalProperties" not in props["city"]  # not an object schema
    assert schema["required"] == ["city"]


def test_whitespace_is_bounded_unless_any_whitespace() -> None:
    assert _schema()["x-guidance"] == {
        "whitespace_flexible": False,
        "item_separator": ", ",
        "key_separator": ": ",
    }
    assert "x-guidance" not in _schema(any_whitespace=True)


def test_unevaluated_properties_counts_as_saying_something() -> None:
    raw = {"type": "object", "properties": {"a": {}}, "unevaluatedProperties": False}
    _, data = guidance_of(StructuredConstraint(json_schema=json.dumps(raw)))
    assert "additionalProperties" not in json.loads(data)


def test_regex_passes_through() -> None:
    assert guidance_of(StructuredConstraint(regex=r"\d{3}-[a-z]+")) == ("regex", r"\d{3}-[a-z]+")


def test_choice_is_an_alternation_of_literals() -> None:
    choices = ("yes", "no way", "a+b", "(x)", "c.d", "50%-off", "#1~2&3")
    kind, pattern = guidance_of(StructuredConstraint(choice=choices))
    assert kind == "regex" and pattern.startswith("(") and pattern.endswith(")")
    assert "no way" in pattern  # a space stays unescaped (Rust regex refuses "\ ")
    compiled = re.compile(pattern)
    for c in choices:
        assert compiled.fullmatch(c), c
    for other in ("aab", "cxd", "x", "yes no"):
        assert not compiled.fullmatch(other), other


def test_escape_regex_escapes_only_metacharacters() -> None:
    assert escape_regex("a b_c") == "a b_c"
    assert escape_regex(r"1.5*[x]") == r"1\.5\*\[x\]"
    assert escape_regex("\\") == "\\\\"


@pytest.mark.parametrize(
    ("constraint", "message"),
    [
        (StructuredConstraint(grammar='root ::= "a"'), "EBNF grammar is not supported"),
        (StructuredConstraint(structural_tag="{}"), "triggered tool-call structure"),
    ],
)
def test_unsupported_constraints(constraint: StructuredConstraint, message: str) -> None:
    with pytest.raises(GuidanceUnsupported, match=message):
        guidance_of(constraint)
    assert issubclass(GuidanceUnsupported, ValueError)


def test_any_json_values_get_bounds() -> None:
    """``json_object``'s "any JSON" schema (``{}``) gets the number bounds of a schema
    node, not llguidance's unbounded any-value."""
    kind, data = guidance_of(StructuredConstraint(json_schema="{}"))
    schema = json.loads(data)
    assert kind == "json_schema" and "servehall_any" in schema["$defs"]
    assert schema["x-guidance"]["whitespace_flexible"] is False
