"""Tests of servehall.testing.bad_schemas: the corpus keeps the promises its docstring
makes (objects, root type ``object`` only, distinct entries), the checker refuses every
bad schema, ``schema_bodies`` puts a schema in each field that carries one, and the
hypothesis strategy draws schemas of both kinds."""

from __future__ import annotations

import json
from typing import Any

import pytest

from servehall.errors import InvalidRequestError
from servehall.structured.schema import check_json_schema
from servehall.testing.bad_schemas import (
    BAD_SCHEMAS,
    UNENFORCEABLE_SCHEMAS,
    json_schemas,
    schema_bodies,
)


@pytest.mark.parametrize("corpus", [BAD_SCHEMAS, UNENFORCEABLE_SCHEMAS])
def test_corpus_entries_are_objects_with_distinct_reasons(
    corpus: list[tuple[dict[str, Any], str]],
) -> None:
    assert corpus
    whys = [why for _, why in corpus]
    assert len(set(whys)) == len(whys)
    for schema, why in corpus:
        assert isinstance(schema, dict), why
        assert schema.get("type", "object") == "object", why
        json.dumps(schema)  # JSON as a client sends it


def test_the_two_corpora_do_not_overlap() -> None:
    bad = {json.dumps(s, sort_keys=True) for s, _ in BAD_SCHEMAS}
    assert not bad & {json.dumps(s, sort_keys=True) for s, _ in UNENFORCEABLE_SCHEMAS}


def test_the_checker_refuses_bad_and_accepts_unenforceable_on_prompt_only_tools() -> None:
    for schema, _why in BAD_SCHEMAS:
        with pytest.raises(InvalidRequestError):
            check_json_schema(schema, "p", decoding=False)
    for schema, why in UNENFORCEABLE_SCHEMAS:
        assert check_json_schema(schema, "p", decoding=False) == schema, why
        with pytest.raises(InvalidRequestError):
            check_json_schema(schema, "p", decoding=True)


def test_schema_bodies_cover_every_field() -> None:
    schema = {"type": "object"}
    bodies = dict(schema_bodies(schema, "m"))
    assert list(bodies) == [
        "response_format.json_schema.schema",
        "guided_json",
        "structured_outputs.json",
        "tools[0].function.parameters",
    ]
    for body in bodies.values():
        assert body["model"] == "m" and body["max_tokens"] == 8 and body["messages"]
    assert (
        bodies["response_format.json_schema.schema"]["response_format"]["json_schema"]["schema"]
        is schema
    )
    assert bodies["guided_json"]["guided_json"] is schema
    assert bodies["structured_outputs.json"]["structured_outputs"] == {"json": schema}
    tools = bodies["tools[0].function.parameters"]
    assert tools["tools"][0]["function"]["parameters"] is schema
    assert tools["tool_choice"] == {"type": "function", "function": {"name": "f"}}


def test_the_strategy_draws_valid_and_malformed_schemas() -> None:
    hypothesis = pytest.importorskip("hypothesis")
    drawn: list[Any] = []

    @hypothesis.settings(max_examples=60, database=None, deadline=None)
    @hypothesis.given(json_schemas())
    def collect(schema: Any) -> None:
        assert isinstance(schema, dict | bool)
        drawn.append(schema)

    collect()
    refused = accepted = 0
    for schema in drawn:
        try:
            check_json_schema(schema, "p", decoding=False)
        except InvalidRequestError:
            refused += 1
        else:
            accepted += 1
    assert refused and accepted  # both kinds occur
