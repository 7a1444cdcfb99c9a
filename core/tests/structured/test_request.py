"""The API layer's structured-output parsing and schema checks (no engine involved)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from servehall.errors import InvalidRequestError, UnsupportedParameterError
from servehall.structured import check_json_schema, structured_request
from servehall.structured.outcome import outcome, requested_kind


def _schema(schema: Any) -> dict[str, Any]:
    return {
        "response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": schema}}
    }


def test_sources_map_to_one_constraint() -> None:
    assert structured_request({}) is None
    assert structured_request({"response_format": {"type": "text"}}) is None
    obj = structured_request({"response_format": {"type": "json_object"}})
    assert obj is not None and obj.kind == "json_object"
    assert json.loads(obj.constraint.json_schema or "") == {
        "type": "object",
        "additionalProperties": True,
    }
    sr = structured_request(_schema({"type": "integer"}))
    assert sr is not None and sr.kind == "json_schema" and not sr.constraint.any_whitespace
    assert sr.param == "response_format.json_schema.schema"
    sr = structured_request({"structured_outputs": {"json": '{"type": "boolean"}'}})
    assert sr is not None and sr.constraint.json_schema == '{"type":"boolean"}'
    sr = structured_request(
        {"structured_outputs": {"regex": "a+", "disable_any_whitespace": False}}
    )
    assert sr is not None and sr.constraint.regex == "a+"
    sr = structured_request({"guided_choice": ["x", "y", "x"]})
    assert sr is not None and sr.constraint.choice == ("x", "y")
    sr = structured_request({"guided_grammar": 'root ::= "a"'})
    assert sr is not None and sr.kind == "grammar" and sr.param == "guided_grammar"
    sr = structured_request({"structured_outputs": {"json": {}, "disable_any_whitespace": False}})
    assert sr is not None and sr.constraint.any_whitespace


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"response_format": {"type": "json_schema"}}, "response_format.json_schema"),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"schema": {}}}},
            "response_format.json_schema.name",
        ),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "a", "strict": 1}}},
            "response_format.json_schema.strict",
        ),
        (_schema({"type": "integer", "multipleOf": 2}), "response_format.json_schema.schema"),
        (_schema({"type": "array", "uniqueItems": True}), "response_format.json_schema.schema"),
        (
            _schema({"type": "string", "pattern": "a+", "maxLength": 3}),
            "response_format.json_schema.schema",
        ),
        (
            _schema({"type": "number", "exclusiveMinimum": 0.5}),
            "response_format.json_schema.schema",
        ),
        (
            _schema({"allOf": [{"type": "object"}, {"type": "object"}]}),
            "response_format.json_schema.schema",
        ),
        (_schema({"$ref": "https://example.com/s.json"}), "response_format.json_schema.schema"),
        (
            _schema({"type": "object", "properties": {"a": {"$ref": "#/$defs/b"}}}),
            "response_format.json_schema.schema",
        ),
        (_schema({"minimum": "3"}), "response_format.json_schema.schema"),
        (_schema(False), "response_format.json_schema.schema"),
        (_schema([1]), "response_format.json_schema.schema"),
        ({"structured_outputs": {}}, "structured_outputs"),
        ({"structured_outputs": {"json_object": "yes"}}, "structured_outputs.json_object"),
        ({"guided_regex": ""}, "guided_regex"),
        ({"guided_choice": ["a", 1]}, "guided_choice"),
        ({"guided_json": "[1"}, "guided_json"),
        ({"guided_json": {}, "structured_outputs": {"regex": "a"}}, "guided_json"),
    ],
)
def test_malformed_or_unenforceable_is_400_naming_the_field(
    body: dict[str, Any], param: str
) -> None:
    with pytest.raises(InvalidRequestError) as info:
        structured_request(body)
    assert info.value.status == 400 and info.value.param == param
    assert info.value.envelope()["error"]["type"] == "invalid_request_error"


def test_refused_extension_fields() -> None:
    for name in ("guided_whitespace_pattern", "guided_decoding_backend"):
        with pytest.raises(UnsupportedParameterError) as info:
            structured_request({name: "x"})
        assert info.value.param == name


def test_normalisation_keeps_meaning() -> None:
    out = check_json_schema(
        {"type": "integer", "exclusiveMinimum": 2, "exclusiveMaximum": 7.5, "minimum": 0}, "p"
    )
    assert out == {"type": "integer", "minimum": 3, "maximum": 7}
    assert check_json_schema(True, "p") is True
    nested = {"$defs": {"n": {"type": "integer", "exclusiveMaximum": 3}}, "$ref": "#/$defs/n"}
    assert check_json_schema(nested, "p")["$defs"]["n"]["maximum"] == 2  # type: ignore[index]


def test_outcome_and_kind() -> None:
    sr = structured_request(_schema({"type": "object", "properties": {"a": {"type": "integer"}}}))
    assert sr is not None
    assert outcome(sr, [('{"a": 1}', "stop")]) == "valid"
    assert outcome(sr, [('{"a": "x"}', "stop")]) == "invalid"
    assert outcome(sr, [('{"a": 1', "length")]) == "length"
    choice = structured_request({"guided_choice": ["yes", "no"]})
    assert choice is not None and outcome(choice, [("maybe", "stop")]) == "invalid"
    assert requested_kind({"guided_json": {}}) == "json_schema"
    assert requested_kind({"structured_outputs": {"choice": ["a"]}}) == "choice"
    assert requested_kind({"response_format": {"type": "text"}}) is None


def test_numbers_without_bounds_get_the_default_bounds() -> None:
    from servehall.structured.schema import NUMBER_BOUND

    out = check_json_schema(
        {
            "type": "object",
            "properties": {
                "i": {"type": "integer"},
                "x": {"type": ["number", "null"], "minimum": 0},
                "big": {"type": "integer", "minimum": 10**18},
                "s": {"type": "string"},
            },
        },
        "p",
    )
    props = out["properties"]  # type: ignore[index]
    assert props["i"] == {"type": "integer", "minimum": -NUMBER_BOUND, "maximum": NUMBER_BOUND}
    assert props["x"]["minimum"] == 0 and props["x"]["maximum"] == NUMBER_BOUND
    assert props["big"]["maximum"] == 10**18 + NUMBER_BOUND  # the range stays non-empty
    assert props["s"] == {"type": "string"}


def test_any_json_numbers_are_digit_capped_in_the_grammar() -> None:
    """The rules xgrammar 0.1.31 prints for "any JSON" numbers are the ones replaced (this
    fails if a new xgrammar prints them differently), and the capped grammar refuses a
    16-digit integer while it accepts 15 digits."""
    pytest.importorskip("xgrammar")
    import xgrammar as xgr

    from servehall.structured.grammar import _UNBOUNDED_ANY_NUMBER_RULES, constraint_ebnf

    plain = str(xgr.Grammar.from_json_schema('{"type": "object"}', any_whitespace=False))
    for name, body in _UNBOUNDED_ANY_NUMBER_RULES.items():
        assert f"{name} ::= {body}" in plain
    sr = structured_request({"response_format": {"type": "json_object"}})
    assert sr is not None
    grammar = xgr.Grammar.from_ebnf(constraint_ebnf(sr.constraint))
    tokens = [chr(c) for c in range(32, 127)]
    compiled = xgr.GrammarCompiler(xgr.TokenizerInfo(tokens)).compile_grammar(grammar)

    def accepts(text: str) -> bool:
        matcher = xgr.GrammarMatcher(compiled, terminate_without_stop_token=True)
        return all(matcher.accept_token(tokens.index(ch)) for ch in text)

    assert accepts('{"a": ' + "9" * 15 + ".123456e-123}")
    assert not accepts('{"a": ' + "9" * 16)
    assert not accepts('{"a": 1.' + "1" * 7)
