"""The structured-output fields of a request → one :class:`~servehall.StructuredConstraint`.

Accepted (at most one source per request; two are a 400):

* OpenAI's ``response_format``: ``{"type": "text"}`` (free text), ``{"type":
  "json_object"}`` (any JSON object), ``{"type": "json_schema", "json_schema": {"name",
  "description"?, "schema"?, "strict"?}}`` (``schema`` absent = any JSON value);
* vLLM's ``structured_outputs``: exactly one of ``json`` (a schema, object or JSON text),
  ``regex``, ``choice`` (non-empty list of strings), ``grammar`` (EBNF), ``json_object``
  (true), plus ``disable_any_whitespace`` (true, the default here, bounds whitespace;
  false allows any whitespace between JSON tokens);
* vLLM's older names ``guided_json``, ``guided_regex``, ``guided_choice``,
  ``guided_grammar`` (``guided_whitespace_pattern`` and ``guided_decoding_backend`` are
  refused: servehall picks the backend and bounds whitespace itself).

Every shape error is a 400 ``invalid_request_error`` whose ``param`` names the field
(``response_format.json_schema.schema``, ``structured_outputs.regex``, ``guided_json``…);
schemas go through :func:`servehall.structured.schema.check_json_schema`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from servehall.engines.contract import StructuredConstraint
from servehall.errors import InvalidRequestError, UnsupportedParameterError
from servehall.structured.schema import check_json_schema

GUIDED_FIELDS = ("guided_json", "guided_regex", "guided_choice", "guided_grammar")
REFUSED_FIELDS = ("guided_whitespace_pattern", "guided_decoding_backend")
MAX_TEXT_CHARS = 64 * 1024
"""Longest regex or grammar accepted."""
MAX_CHOICES = 1024
_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


@dataclass(frozen=True, slots=True)
class StructuredRequest:
    """A request's constraint, with what the API layer needs around it.

    Attributes:
        constraint: what the engine enforces.
        kind: the response format kind for records and metrics: ``json_object``,
            ``json_schema``, ``regex``, ``choice`` or ``grammar``.
        param: the request field it came from (for an engine's refusal).
        schema: the normalised JSON Schema (``json_*`` kinds), to validate the output.
    """

    constraint: StructuredConstraint
    kind: str
    param: str
    schema: Any = None


def _bad(message: str, param: str) -> InvalidRequestError:
    return InvalidRequestError(message, param=param)


def _schema_value(value: Any, param: str) -> Any:
    """A schema given as an object, a boolean, or JSON text."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError as exc:
            raise _bad(f"'{param}' is not valid JSON: {exc}", param) from None
    if not isinstance(value, dict | bool):
        raise _bad(f"'{param}' must be a JSON Schema object.", param)
    return value


def _text(value: Any, param: str) -> str:
    if not isinstance(value, str) or not value:
        raise _bad(f"'{param}' must be a non-empty string.", param)
    if len(value) > MAX_TEXT_CHARS:
        raise _bad(f"'{param}' is longer than {MAX_TEXT_CHARS} characters.", param)
    return value


def _choices(value: Any, param: str) -> tuple[str, ...]:
    if (
        not isinstance(value, list)
        or not value
        or len(value) > MAX_CHOICES
        or not all(isinstance(v, str) and v for v in value)
    ):
        raise _bad(f"'{param}' must be a list of 1 to {MAX_CHOICES} non-empty strings.", param)
    return tuple(dict.fromkeys(value))


def _json(schema: Any, param: str, kind: str, any_ws: bool) -> StructuredRequest:
    norm = check_json_schema(schema, param)
    text = json.dumps(norm, separators=(",", ":"), sort_keys=False)
    return StructuredRequest(
        StructuredConstraint(json_schema=text, any_whitespace=any_ws), kind, param, norm
    )


#: ``json_object``: any JSON object (``additionalProperties`` stated, since the grammar
#: backend's strict mode would otherwise allow only ``{}``).
JSON_OBJECT_SCHEMA: dict[str, Any] = {"type": "object", "additionalProperties": True}


def _from_response_format(rf: Any) -> StructuredRequest | None:
    p = "response_format"
    if not isinstance(rf, dict):
        raise _bad("'response_format' must be an object.", p)
    kind = rf.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return _json(JSON_OBJECT_SCHEMA, p, "json_object", False)
    if kind != "json_schema":
        raise _bad(
            "'response_format.type' must be 'text', 'json_object' or 'json_schema'.",
            "response_format.type",
        )
    js = rf.get("json_schema")
    if not isinstance(js, dict):
        raise _bad(
            "'response_format.json_schema' must be an object with 'name' and 'schema'.",
            "response_format.json_schema",
        )
    name = js.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        raise _bad(
            "'response_format.json_schema.name' must be 1-64 letters, digits, '_' or '-'.",
            "response_format.json_schema.name",
        )
    strict = js.get("strict")
    if strict is not None and not isinstance(strict, bool):
        raise _bad(
            "'response_format.json_schema.strict' must be a boolean.",
            "response_format.json_schema.strict",
        )
    schema = js.get("schema", True)
    return _json(
        _schema_value(schema, "response_format.json_schema.schema"),
        "response_format.json_schema.schema",
        "json_schema",
        False,
    )


def _from_structured_outputs(so: Any) -> StructuredRequest:
    p = "structured_outputs"
    if not isinstance(so, dict):
        raise _bad("'structured_outputs' must be an object.", p)
    dw = so.get("disable_any_whitespace")
    if dw is not None and not isinstance(dw, bool):
        raise _bad(
            f"'{p}.disable_any_whitespace' must be a boolean.", f"{p}.disable_any_whitespace"
        )
    any_ws = dw is False
    keys = [
        k
        for k in ("json", "regex", "choice", "grammar", "json_object", "structural_tag")
        if so.get(k) not in (None, False)
    ]
    if len(keys) != 1:
        raise _bad(
            "'structured_outputs' needs exactly one of 'json', 'regex', 'choice', "
            "'grammar', 'json_object'.",
            p,
        )
    key = keys[0]
    param = f"{p}.{key}"
    value = so[key]
    if key == "json":
        return _json(_schema_value(value, param), param, "json_schema", any_ws)
    if key == "json_object":
        if value is not True:
            raise _bad(f"'{param}' must be true.", param)
        return _json(JSON_OBJECT_SCHEMA, param, "json_object", any_ws)
    return _plain(key, value, param)


def _plain(key: str, value: Any, param: str) -> StructuredRequest:
    if key == "regex":
        return StructuredRequest(StructuredConstraint(regex=_text(value, param)), "regex", param)
    if key == "choice":
        return StructuredRequest(
            StructuredConstraint(choice=_choices(value, param)), "choice", param
        )
    if key == "grammar":
        return StructuredRequest(
            StructuredConstraint(grammar=_text(value, param)), "grammar", param
        )
    raise UnsupportedParameterError(f"'{param}' is not supported by this server.", param=param)


def structured_request(body: dict[str, Any]) -> StructuredRequest | None:
    """The constraint a request body asks for, or None for free text.

    Args:
        body: the raw JSON request object (chat or completions).

    Raises:
        InvalidRequestError: a malformed field, more than one source, or a schema that
            cannot be enforced (400, ``param`` names the field).
        UnsupportedParameterError: ``guided_whitespace_pattern``,
            ``guided_decoding_backend``, ``structured_outputs.structural_tag``.
    """
    for name in REFUSED_FIELDS:
        if body.get(name) is not None:
            raise UnsupportedParameterError(
                f"'{name}' is not supported by this server.", param=name
            )
    sources = [
        n
        for n in ("response_format", "structured_outputs", *GUIDED_FIELDS)
        if body.get(n) is not None and not (n == "response_format" and body[n] == {"type": "text"})
    ]
    if not sources:
        return None
    if len(sources) > 1:
        raise _bad(f"Only one of {', '.join(repr(s) for s in sources)} may be set.", sources[1])
    name = sources[0]
    value = body[name]
    if name == "response_format":
        return _from_response_format(value)
    if name == "structured_outputs":
        return _from_structured_outputs(value)
    if name == "guided_json":
        return _json(_schema_value(value, name), name, "json_schema", False)
    return _plain(name.removeprefix("guided_"), value, name)
