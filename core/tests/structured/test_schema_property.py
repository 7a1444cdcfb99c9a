"""The one JSON Schema checker (``servehall.structured.schema.check_json_schema``) over
generated and malformed schemas: every schema gives a normalised copy or the project's
400 naming the field, never another exception — in every request field that carries a
schema (``response_format``, ``guided_json``, ``structured_outputs.json``, tool
``parameters``), and what it accepts for decoding reaches the engines' converters
(xgrammar's EBNF, ONNX Runtime's guidance) without an exception other than their 400s."""

from __future__ import annotations

import contextlib
import json
from functools import partial
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings

from servehall.api.tools import check_parameters
from servehall.engines.contract import StructuredConstraint
from servehall.engines.onnxruntime.guidance import guidance_of
from servehall.errors import InvalidRequestError
from servehall.structured.request import structured_request
from servehall.structured.schema import check_json_schema
from servehall.testing.bad_schemas import (
    BAD_SCHEMAS,
    UNENFORCEABLE_SCHEMAS,
    json_schemas,
    schema_bodies,
)
from servehall.tools.parsers import HERMES, ToolParser
from servehall.tools.plan import TOOLS_CODE, FunctionTool, ToolPlan

PROPERTY = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _refused(call: Any, param: str) -> InvalidRequestError | None:
    """None when ``call()`` accepts; the 400 when it refuses (asserting its ``param``)."""
    try:
        call()
    except InvalidRequestError as exc:
        assert exc.status == 400 and exc.type == "invalid_request_error"
        assert exc.param == param, (exc.param, param, str(exc))
        return exc
    return None


def _in_field(schema: Any, param: str, body: dict[str, Any]) -> InvalidRequestError | None:
    """``body`` (from :func:`schema_bodies`) through the API layer's parsing."""
    if param.startswith("tools"):
        if not isinstance(schema, dict):
            return None  # the wire model refuses a non-object 'parameters' (422)
        plan = ToolPlan((FunctionTool("f", schema),), "named", "f")

        def forced() -> None:
            check_parameters(schema, param)
            plan.constraint(_hermes())

        return _refused(forced, param)
    if param == "structured_outputs.json" and schema is False:
        param = "structured_outputs"  # 'json': false is no source at all
    return _refused(lambda: structured_request(body), param)


def _hermes() -> ToolParser:
    return HERMES


@pytest.mark.parametrize(("schema", "why"), BAD_SCHEMAS, ids=[w for _, w in BAD_SCHEMAS])
def test_bad_schemas_are_400_in_every_field(schema: dict[str, Any], why: str) -> None:
    for decoding in (True, False):
        exc = _refused(partial(check_json_schema, schema, "p", decoding=decoding), "p")
        assert exc is not None, (why, decoding)
    for param, body in schema_bodies(schema, "m"):
        assert _in_field(schema, param, body) is not None, (why, param)
    tool_exc = _refused(
        lambda: check_parameters(schema, "tools[0].function.parameters"),
        "tools[0].function.parameters",
    )
    assert tool_exc is not None and tool_exc.code == TOOLS_CODE


@pytest.mark.parametrize(
    ("schema", "why"), UNENFORCEABLE_SCHEMAS, ids=[w for _, w in UNENFORCEABLE_SCHEMAS]
)
def test_unenforceable_schemas_are_refused_only_where_they_constrain(
    schema: dict[str, Any], why: str
) -> None:
    assert check_json_schema(schema, "p", decoding=False) == schema
    check_parameters(schema, "tools[0].function.parameters")  # an auto tool: accepted
    for param, body in schema_bodies(schema, "m"):
        assert _in_field(schema, param, body) is not None, (why, param)
    strict = ToolPlan((FunctionTool("f", schema, strict=True),), "auto", parallel=False)
    exc = _refused(lambda: strict.constraint(_hermes()), "tools[0].function.parameters")
    assert exc is not None and exc.code == TOOLS_CODE
    required = ToolPlan((FunctionTool("g"), FunctionTool("f", schema)), "required")
    assert _refused(lambda: required.required_schema(), "tools[1].function.parameters")


def test_required_hoists_the_checked_schemas() -> None:
    schema = {
        "type": "object",
        "properties": {"n": {"$ref": "#/$defs/n"}},
        "$defs": {"n": {"type": "integer", "exclusiveMinimum": 0}},
    }
    plan = ToolPlan((FunctionTool("f", schema),), "required")
    out = plan.required_schema()
    assert out["$defs"]["n"] == {"type": "integer", "minimum": 1, "maximum": 10**15 - 1}
    assert "$defs" not in out["items"]["anyOf"][0]["properties"]["parameters"]
    assert schema["$defs"]["n"] == {"type": "integer", "exclusiveMinimum": 0}  # not changed


@PROPERTY
@given(json_schemas())
def test_any_schema_is_normalised_or_a_400(schema: Any) -> None:
    for decoding in (True, False):
        try:
            out = check_json_schema(schema, "p", decoding=decoding)
        except InvalidRequestError as exc:
            assert exc.status == 400 and exc.param == "p"
            continue
        assert json.loads(json.dumps(out)) == out  # plain JSON, a new object
        assert out is not schema or isinstance(schema, bool)
        if decoding:
            # what the engines receive: ONNX Runtime's guidance converts it without error
            kind, data = guidance_of(StructuredConstraint(json_schema=json.dumps(out)))
            assert kind == "json_schema" and isinstance(json.loads(data), dict)


@PROPERTY
@given(json_schemas())
def test_any_schema_in_any_field_is_accepted_or_a_400_naming_it(schema: Any) -> None:
    for param, body in schema_bodies(schema, "m"):
        _in_field(schema, param, body)
    if isinstance(schema, dict):
        for choice in ("required", "auto"):
            plan = ToolPlan(
                (FunctionTool("f", schema, strict=True), FunctionTool("g", schema)),
                choice,  # type: ignore[arg-type]
                parallel=False,
            )

            try:
                check_parameters(schema, "tools[0].function.parameters")
                plan.constraint(_hermes())
            except InvalidRequestError as exc:
                assert exc.param in (
                    "tools[0].function.parameters",
                    "tools[1].function.parameters",
                    "tools",
                ), exc.param


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(json_schemas())
def test_accepted_schemas_compile_or_are_a_grammar_error(schema: Any) -> None:
    """xgrammar (the OpenVINO and torch engines) on what the checker accepts: an EBNF,
    or ``GrammarError`` (the engine's 400), never another error."""
    pytest.importorskip("xgrammar")
    from servehall.structured.grammar import GrammarError, constraint_ebnf

    try:
        out = check_json_schema(schema, "p")
    except InvalidRequestError:
        return
    with contextlib.suppress(GrammarError):
        constraint_ebnf(StructuredConstraint(json_schema=json.dumps(out)))
