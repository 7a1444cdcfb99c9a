"""``servehall.structured.schema.check_json_schema``: refusals (with the JSON pointer of
the offending keyword), normalisation of bounds, and the ``decoding=False`` mode."""

from __future__ import annotations

from typing import Any

import pytest

from servehall.errors import InvalidRequestError
from servehall.structured.schema import (
    MAX_DEPTH,
    MAX_SCHEMA_CHARS,
    NUMBER_BOUND,
    SUPPORTED_FORMATS,
    WEAKENED_KEYWORDS,
    check_json_schema,
)


def _refusal(schema: Any, **kw: Any) -> InvalidRequestError:
    with pytest.raises(InvalidRequestError) as info:
        check_json_schema(schema, "response_format", **kw)
    assert info.value.status == 400
    assert info.value.param == "response_format"
    return info.value


def test_booleans() -> None:
    assert check_json_schema(True, "p") is True
    assert "matches nothing" in _refusal(False).message
    assert check_json_schema(False, "p", decoding=False) is False


@pytest.mark.parametrize("schema", [[], "string", 3, None])
def test_not_an_object(schema: Any) -> None:
    assert "object or a boolean" in _refusal(schema).message


def test_returns_a_normalised_copy_leaving_the_input_alone() -> None:
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}}
    out = check_json_schema(schema, "p")
    assert isinstance(out, dict)
    assert out is not schema
    assert schema["properties"]["n"] == {"type": "integer"}
    assert out["properties"]["n"] == {
        "type": "integer",
        "minimum": -NUMBER_BOUND,
        "maximum": NUMBER_BOUND,
    }


def test_default_bounds_keep_a_single_far_bound_non_empty() -> None:
    out = check_json_schema({"type": "number", "minimum": 10**16}, "p")
    assert isinstance(out, dict)
    assert out["minimum"] == 10**16 and out["maximum"] == 10**16 + NUMBER_BOUND
    out = check_json_schema({"type": "number", "maximum": -(10**16)}, "p")
    assert isinstance(out, dict)
    assert out["maximum"] == -(10**16) and out["minimum"] == -(10**16) - NUMBER_BOUND
    out = check_json_schema({"type": ["integer", "null"], "minimum": 0}, "p")
    assert isinstance(out, dict)
    assert out["minimum"] == 0 and out["maximum"] == NUMBER_BOUND
    # Strings get no numeric bounds.
    assert check_json_schema({"type": "string"}, "p") == {"type": "string"}


def test_integer_exclusive_bounds_become_inclusive() -> None:
    out = check_json_schema(
        {"type": "integer", "exclusiveMinimum": 3, "exclusiveMaximum": 7.5}, "p"
    )
    assert out == {"type": "integer", "minimum": 4, "maximum": 7}
    # The tighter of a stated inclusive bound and the converted exclusive one wins.
    out = check_json_schema(
        {
            "type": "integer",
            "exclusiveMinimum": 3,
            "minimum": 10,
            "exclusiveMaximum": 5,
            "maximum": 2,
        },
        "p",
    )
    assert out == {"type": "integer", "minimum": 10, "maximum": 2}


def test_exclusive_bounds_refused_on_numbers() -> None:
    err = _refusal({"type": "number", "exclusiveMinimum": 0})
    assert "/exclusiveMinimum" in err.message and "integers only" in err.message
    # Draft 4's boolean form is refused too (not a bound on an integer).
    err = _refusal(
        {
            "$schema": "http://json-schema.org/draft-04/schema#",
            "type": "integer",
            "minimum": 0,
            "exclusiveMinimum": True,
        }
    )
    assert "exclusiveMinimum" in err.message


@pytest.mark.parametrize("keyword", WEAKENED_KEYWORDS)
def test_weakened_keywords_refused_while_decoding(keyword: str) -> None:
    value: Any = {
        "multipleOf": 2,
        "uniqueItems": True,
        "minContains": 1,
        "maxContains": 1,
        "minProperties": 1,
        "maxProperties": 1,
        "dependentRequired": {},
        "dependencies": {},
    }.get(keyword, {})
    schema = {"type": "object", "properties": {"x": {keyword: value}}}
    err = _refusal(schema)
    assert f"/properties/x/{keyword}" in err.message
    assert "cannot be enforced" in err.message
    # Only rendered into the prompt: accepted and unchanged.
    assert check_json_schema(schema, "p", decoding=False) == schema


def test_all_of_with_several_members() -> None:
    assert check_json_schema({"allOf": [{"type": "string"}]}, "p") == {
        "allOf": [{"type": "string"}]
    }
    err = _refusal({"allOf": [{"type": "string"}, {"maxLength": 3}]})
    assert "'/allOf'" in err.message


def test_pattern_with_length() -> None:
    assert check_json_schema({"type": "string", "pattern": "^a+$"}, "p")
    err = _refusal({"type": "string", "pattern": "^a+$", "maxLength": 3})
    assert "/pattern" in err.message


def test_formats() -> None:
    for fmt in SUPPORTED_FORMATS:
        assert check_json_schema({"type": "string", "format": fmt}, "p")
    err = _refusal({"type": "string", "format": "credit-card"})
    assert "'credit-card' is not supported" in err.message
    assert check_json_schema({"type": "string", "format": "credit-card"}, "p", decoding=False)


def test_refs() -> None:
    schema = {
        "$defs": {"a/b": {"type": "string"}, "c~d": {"type": "boolean"}},
        "type": "object",
        "properties": {
            "x": {"$ref": "#/$defs/a~1b"},
            "y": {"$ref": "#/$defs/c~0d"},
            "z": {"$ref": "#"},
            "w": {"$ref": "#/properties/x"},
        },
    }
    assert check_json_schema(schema, "p")
    err = _refusal({"properties": {"x": {"$ref": "#/$defs/missing"}}})
    assert "/properties/x/$ref" in err.message and "does not resolve" in err.message
    err = _refusal({"properties": {"x": {"$ref": "https://example.com/s.json"}}})
    assert "only local references" in err.message
    assert check_json_schema({"anyOf": [{"$ref": "#/anyOf/1"}, {"type": "null"}]}, "p")
    assert "does not resolve" in _refusal({"anyOf": [{"$ref": "#/anyOf/5"}]}).message


def test_too_deep_and_too_long() -> None:
    node: dict[str, Any] = {"type": "string"}
    for _ in range(MAX_DEPTH + 1):
        node = {"type": "array", "items": node}
    assert f"deeper than {MAX_DEPTH}" in _refusal(node).message
    long = {"type": "string", "description": "x" * MAX_SCHEMA_CHARS}
    assert "longer than" in _refusal(long).message


@pytest.mark.parametrize(
    ("schema", "pointer"),
    [
        ({"type": "text"}, "/type"),
        ({"type": []}, "/type"),
        ({"properties": {"a": {"type": 3}}}, "/properties/a/type"),
        ({"type": "string", "minLength": -1}, "/minLength"),
        ({"type": "integer", "minimum": "1"}, "/minimum"),
        ({"type": "object", "required": "a"}, "/required"),
        ({"enum": "a"}, "/enum"),
        ({"anyOf": []}, "/anyOf"),
        ({"$schema": 7}, "/$schema"),
    ],
)
def test_malformed_keywords_named(schema: dict[str, Any], pointer: str) -> None:
    err = _refusal(schema, decoding=False)
    assert f"at '{pointer}" in err.message


def test_invalid_against_meta_schema_and_code_passed_through() -> None:
    with pytest.raises(InvalidRequestError) as info:
        check_json_schema({"type": "object", "properties": []}, "tools", code="invalid_tools")
    assert info.value.code == "invalid_tools"
    assert info.value.param == "tools"


def test_draft7_defs_checked_one_by_one() -> None:
    draft7 = "http://json-schema.org/draft-07/schema#"
    ok = {"$schema": draft7, "$defs": {"a": {"type": "string"}}, "$ref": "#/$defs/a"}
    assert check_json_schema(ok, "p")
    # Draft 7's meta-schema does not know "$defs": the entry is checked here.
    bad = {"$schema": draft7, "$defs": {"a": {"minItems": "x"}}}
    err = _refusal(bad, decoding=False)
    assert "/$defs/a" in err.message


def test_draft4_tuple_items_walked() -> None:
    draft4 = "http://json-schema.org/draft-04/schema#"
    schema = {
        "$schema": draft4,
        "type": "array",
        "items": [{"type": "integer"}, {"type": "string"}],
    }
    out = check_json_schema(schema, "p")
    assert isinstance(out, dict)
    assert out["items"][0]["maximum"] == NUMBER_BOUND
    assert (
        "/items/1/format"
        in _refusal(
            {"$schema": draft4, "items": [{"type": "integer"}, {"type": "string", "format": "zip"}]}
        ).message
    )
