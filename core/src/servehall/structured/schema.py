"""Checking and normalising a JSON Schema for constrained decoding (once, in the API layer).

A schema is refused with 400 ``invalid_request_error`` (``param`` = the request field) when

* it is not a valid JSON Schema (the meta-schema of its ``$schema`` dialect, 2020-12 by
  default, checked with ``jsonschema``'s ``check_schema``);
* it uses a keyword the grammar backend would silently weaken: xgrammar 0.1.31 (the
  version OpenVINO GenAI 2026.4 compiles in, and the one the torch engine uses) accepts
  these keywords but does not enforce them, measured one keyword at a time against a
  violating instance (the idea follows vLLM's ``has_xgrammar_unsupported_json_features``):
  ``multipleOf``, ``uniqueItems``, ``contains``/``minContains``/``maxContains``,
  ``minProperties``/``maxProperties``, ``not``, ``if``/``then``/``else``,
  ``dependentRequired``/``dependentSchemas``/``dependencies``, ``allOf`` with more than one
  member, ``pattern`` together with ``minLength``/``maxLength``, a string ``format`` outside
  :data:`SUPPORTED_FORMATS`, ``exclusiveMinimum``/``exclusiveMaximum`` on a ``number``;
* a ``$ref`` is not a local JSON pointer (``#/...``) that resolves inside the schema;
* it nests deeper than :data:`MAX_DEPTH` or its text exceeds :data:`MAX_SCHEMA_CHARS`.

Normalisation (meaning kept): ``exclusiveMinimum: n`` on an ``integer`` becomes
``minimum: floor(n) + 1`` (xgrammar 0.1.31 ignores the exclusive bounds; the inclusive
ones it enforces), and likewise ``exclusiveMaximum``.

Default bounds (meaning narrowed, on purpose): an ``integer`` or ``number`` without a
``minimum``/``maximum`` gets ``-NUMBER_BOUND``/``NUMBER_BOUND`` (:data:`NUMBER_BOUND`,
15 digits). Without bounds the grammar allows any count of digits and a weak model writes
digits until ``max_tokens`` (seen on the demo model: ``finish_reason: length`` on a
one-integer schema); with both bounds xgrammar 0.1.31 turns the range into a finite
grammar (integer part at most 15 digits, at most 6 fraction digits, no exponent), and
vLLM's xgrammar and llguidance enforce ``minimum``/``maximum`` as well, so one schema
change bounds numbers on every engine. The normalised schema is what the output is
validated against. The boolean schema ``true`` and
``{}`` mean any JSON value (whitespace stays bounded, see
:class:`servehall.StructuredConstraint`); ``false`` is refused (nothing can match).
"""

from __future__ import annotations

import json
import math
from typing import Any

from servehall.errors import InvalidRequestError

MAX_DEPTH = 64
"""Deepest nesting of subschemas accepted."""
MAX_SCHEMA_CHARS = 256 * 1024
"""Longest schema (as compact JSON text) accepted."""
NUMBER_BOUND = 10**15 - 1
"""Default ``maximum`` (and negated, ``minimum``) of an ``integer``/``number`` schema that
states none: 15 digits, below JSON's exact-integer limit 2**53 - 1."""

SUPPORTED_FORMATS = frozenset(
    {
        "email",
        "date",
        "time",
        "date-time",
        "duration",
        "ipv4",
        "ipv6",
        "hostname",
        "uuid",
        "uri",
        "uri-reference",
        "uri-template",
        "json-pointer",
        "relative-json-pointer",
    }
)
"""String formats xgrammar 0.1.31 turns into a grammar (others would be free strings)."""

#: Keywords xgrammar accepts but does not enforce: refused instead of silently weakened.
WEAKENED_KEYWORDS: tuple[str, ...] = (
    "multipleOf",
    "uniqueItems",
    "contains",
    "minContains",
    "maxContains",
    "minProperties",
    "maxProperties",
    "not",
    "if",
    "then",
    "else",
    "dependentRequired",
    "dependentSchemas",
    "dependencies",
    "unevaluatedItems",
)

#: Keywords whose value is one subschema / a map of subschemas / a list of subschemas.
_ONE = ("items", "additionalProperties", "unevaluatedProperties", "propertyNames")
_MAP = ("properties", "$defs", "definitions", "patternProperties")
_LIST = ("anyOf", "oneOf", "allOf", "prefixItems")


def _refuse(param: str, where: str, message: str) -> InvalidRequestError:
    at = f" at '{where}'" if where else ""
    return InvalidRequestError(f"Invalid schema for '{param}'{at}: {message}", param=param)


def check_json_schema(schema: Any, param: str) -> dict[str, Any] | bool:
    """Validate ``schema`` and return its normalised copy (see the module docstring).

    Args:
        schema: the decoded schema (a dict or a boolean).
        param: the request field that carried it, for the error's ``param``.

    Returns:
        The normalised schema (a new object; the input is not changed).

    Raises:
        InvalidRequestError: 400 naming ``param``; the message names the JSON pointer of
            the offending keyword.
    """
    import jsonschema

    if schema is False:
        raise _refuse(param, "", "the schema 'false' matches nothing")
    if schema is True:
        return True
    if not isinstance(schema, dict):
        raise _refuse(param, "", "a JSON Schema must be an object or a boolean")
    text = json.dumps(schema, separators=(",", ":"))
    if len(text) > MAX_SCHEMA_CHARS:
        raise _refuse(param, "", f"the schema is longer than {MAX_SCHEMA_CHARS} characters")
    try:
        cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
        cls.check_schema(schema)
    except jsonschema.SchemaError as exc:
        where = "/" + "/".join(str(p) for p in exc.path) if exc.path else ""
        raise _refuse(param, where, exc.message) from None
    except RecursionError:
        raise _refuse(param, "", f"the schema nests deeper than {MAX_DEPTH} levels") from None
    out = json.loads(text)  # a private copy to normalise
    _walk(out, out, "", 0, param)
    return out


def _walk(node: Any, root: dict[str, Any], where: str, depth: int, param: str) -> None:
    if depth > MAX_DEPTH:
        raise _refuse(param, where, f"the schema nests deeper than {MAX_DEPTH} levels")
    if isinstance(node, bool):
        return
    if not isinstance(node, dict):
        return  # check_schema already refused non-schemas where a schema belongs
    for key in WEAKENED_KEYWORDS:
        if key in node:
            raise _refuse(param, f"{where}/{key}", f"'{key}' cannot be enforced while decoding")
    if isinstance(node.get("allOf"), list) and len(node["allOf"]) > 1:
        raise _refuse(param, f"{where}/allOf", "'allOf' with more than one schema is not supported")
    if "pattern" in node and ("minLength" in node or "maxLength" in node):
        raise _refuse(
            param,
            f"{where}/pattern",
            "'pattern' together with 'minLength'/'maxLength' is not supported",
        )
    fmt = node.get("format")
    if isinstance(fmt, str) and fmt not in SUPPORTED_FORMATS:
        raise _refuse(param, f"{where}/format", f"string format '{fmt}' is not supported")
    _exclusive_bounds(node, where, param)
    _default_bounds(node)
    ref = node.get("$ref")
    if ref is not None:
        _check_ref(ref, root, f"{where}/$ref", param)
    for key in _ONE:
        if key in node:
            _walk(node[key], root, f"{where}/{key}", depth + 1, param)
    for key in _MAP:
        sub = node.get(key)
        if isinstance(sub, dict):
            for name, child in sub.items():
                _walk(child, root, f"{where}/{key}/{name}", depth + 1, param)
    for key in _LIST:
        sub = node.get(key)
        if isinstance(sub, list):
            for i, child in enumerate(sub):
                _walk(child, root, f"{where}/{key}/{i}", depth + 1, param)


def _exclusive_bounds(node: dict[str, Any], where: str, param: str) -> None:
    """Integer exclusive bounds → inclusive ones; refuse them on numbers."""
    types = node.get("type")
    type_set = {types} if isinstance(types, str) else set(types or ())
    for key, inclusive, step in (
        ("exclusiveMinimum", "minimum", 1),
        ("exclusiveMaximum", "maximum", -1),
    ):
        if key not in node:
            continue
        bound = node[key]
        if type_set != {"integer"} or isinstance(bound, bool):
            raise _refuse(
                param,
                f"{where}/{key}",
                f"'{key}' is supported on integers only (use '{inclusive}')",
            )
        edge = math.floor(bound) + 1 if step > 0 else math.ceil(bound) - 1
        del node[key]
        if inclusive in node:
            edge = max(edge, node[inclusive]) if step > 0 else min(edge, node[inclusive])
        node[inclusive] = int(edge)


def _default_bounds(node: dict[str, Any]) -> None:
    """Give an ``integer``/``number`` schema without bounds the default ones (see the
    module docstring); a single stated bound beyond the default keeps the range non-empty."""
    types = node.get("type")
    type_set = {types} if isinstance(types, str) else set(types or ())
    if not type_set & {"integer", "number"}:
        return
    low, high = node.get("minimum"), node.get("maximum")
    if low is None:
        node["minimum"] = (
            -NUMBER_BOUND if high is None or high >= -NUMBER_BOUND else high - NUMBER_BOUND
        )
    if high is None:
        node["maximum"] = NUMBER_BOUND if low is None or low <= NUMBER_BOUND else low + NUMBER_BOUND


def _check_ref(ref: Any, root: dict[str, Any], where: str, param: str) -> None:
    if not isinstance(ref, str) or not (ref == "#" or ref.startswith("#/")):
        raise _refuse(param, where, f"only local references ('#/...') are supported, not {ref!r}")
    node: Any = root
    for raw in ref[2:].split("/") if ref != "#" else ():
        part = raw.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            raise _refuse(param, where, f"reference {ref!r} does not resolve")
