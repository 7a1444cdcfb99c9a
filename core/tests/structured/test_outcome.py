"""``servehall.structured.outcome``: the kind a body asks for (read without validating)
and the outcome of its choices: ``valid``, ``invalid`` or ``length``."""

from __future__ import annotations

from typing import Any

import pytest

from servehall.structured.outcome import outcome, requested_kind
from servehall.structured.request import StructuredRequest, structured_request

_SCHEMA = {
    "type": "object",
    "properties": {"n": {"type": "integer"}},
    "required": ["n"],
    "additionalProperties": False,
}


def _sr(body: dict[str, Any]) -> StructuredRequest:
    sr = structured_request(body)
    assert sr is not None
    return sr


@pytest.mark.parametrize(
    ("body", "kind"),
    [
        ({}, None),
        ({"response_format": {"type": "text"}}, None),
        ({"response_format": {"type": "json_object"}}, "json_object"),
        ({"response_format": {"type": "json_schema"}}, "json_schema"),
        ({"structured_outputs": {"json": {"type": "object"}}}, "json_schema"),
        ({"structured_outputs": {"regex": "a+"}}, "regex"),
        ({"structured_outputs": {"choice": ["a"]}}, "choice"),
        ({"structured_outputs": {"grammar": "root ::= 'a'"}}, "grammar"),
        ({"structured_outputs": {"json": None, "json_object": False}}, None),
        ({"guided_json": {"type": "object"}}, "json_schema"),
        ({"guided_regex": "a+"}, "regex"),
        ({"guided_choice": ["x"]}, "choice"),
        ({"response_format": "not a dict"}, None),
    ],
)
def test_requested_kind_reads_every_source(body: dict[str, Any], kind: str | None) -> None:
    assert requested_kind(body) == kind


def test_schema_outputs_are_validated_against_the_schema() -> None:
    sr = _sr(
        {
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "n", "schema": _SCHEMA},
            }
        }
    )
    assert outcome(sr, [('{"n": 1}', "stop")]) == "valid"
    assert outcome(sr, [('{"n": "one"}', "stop")]) == "invalid"
    assert outcome(sr, [("{not json", "stop")]) == "invalid"
    assert outcome(sr, [('{"n": 1}', "stop"), ('{"m": 1}', "stop")]) == "invalid"


def test_a_choice_not_ended_by_stop_is_length_whatever_the_others() -> None:
    sr = _sr(
        {
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "n", "schema": _SCHEMA},
            }
        }
    )
    assert outcome(sr, [('{"n": "bad"}', "stop"), ('{"n"', "length")]) == "length"
    assert outcome(sr, [('{"n": 1}', "abort")]) == "length"


def test_json_object_accepts_any_object_only() -> None:
    sr = _sr({"response_format": {"type": "json_object"}})
    assert outcome(sr, [('{"a": [1, 2]}', "stop")]) == "valid"
    assert outcome(sr, [("[1, 2]", "stop")]) == "invalid"
    assert outcome(sr, [("nope", "stop")]) == "invalid"


def test_regex_and_choice() -> None:
    regex = _sr({"structured_outputs": {"regex": "a+b"}})
    assert outcome(regex, [("aaab", "stop")]) == "valid"
    assert outcome(regex, [("aaabx", "stop")]) == "invalid"
    choice = _sr({"structured_outputs": {"choice": ["yes", "no"]}})
    assert outcome(choice, [("no", "stop")]) == "valid"
    assert outcome(choice, [("maybe", "stop")]) == "invalid"


def test_no_choices_are_valid() -> None:
    assert outcome(_sr({"response_format": {"type": "json_object"}}), []) == "valid"
