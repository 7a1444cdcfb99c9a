r"""Length-bounded JSON strings that are always JSON (engine side, before a grammar compile).

xgrammar's rule for a ``string`` with ``minLength``/``maxLength`` is one character class
repeated, ``[^"\\\r\n]`` — in 0.1.31 (torch, openvino_cpu) and in 0.2.8 (vLLM 0.32)
alike — which admits the raw control characters U+0000-U+001F that JSON forbids inside a
string (its unbounded string rule excludes them): ``{"city": "\x1501234567ind"}`` was a
real output that ``json.loads`` refuses. Neither version has an option to exclude them.

:func:`json_safe_lengths` rewrites each such string schema into the equivalent
``pattern`` over the characters a JSON string may hold (:data:`JSON_STRING_UNIT`: any
character but ``"``, ``\`` and U+0000-U+001F, or an escape, a surrogate pair's
two escapes counting as one), repeated ``{min,max}``
times. Both xgrammar versions compile it into a bounded rule that excludes the control
characters: 0.1.31 reads a schema ``pattern`` over the JSON text (an escape such as
``\n`` is one unit: one character of the decoded string), 0.2.8 over the decoded string
(it admits no escapes inside a pattern string at all). Either way each unit is one
character of the decoded value, so ``minLength``/``maxLength`` hold exactly as stated
(the output is still validated against the schema the client sent).

ONNX Runtime's llguidance compiles ``minLength``/``maxLength`` over JSON-legal
characters itself and gets the schema unchanged.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

JSON_STRING_UNIT = (
    r"(\\u[dD][89abAB][0-9a-fA-F]{2}\\u[dD][c-fC-F][0-9a-fA-F]{2}"
    r'|[^"\\\x00-\x1f]|\\["\\/bfnrt]|\\u[0-9a-fA-F]{4})'
)
"""One character (code point) of a JSON string's value as it appears in JSON text
(regex): a surrogate-pair escape, a character other than ``"``, ``\\`` and
U+0000-U+001F, or a one-character escape."""

#: Keywords whose value is one subschema / a map of subschemas / a list of subschemas.
_ONE = ("items", "additionalProperties", "unevaluatedProperties", "propertyNames")
_MAP = ("properties", "$defs", "definitions", "patternProperties")
_LIST = ("anyOf", "oneOf", "allOf", "prefixItems")
#: A string schema with one of these is left alone (its grammar is not the bounded rule).
_OWN_GRAMMAR = ("pattern", "format", "enum", "const")


def _is_string(node: dict[str, Any]) -> bool:
    types = node.get("type")
    return types == "string" or (isinstance(types, list) and "string" in types)


def _bounded_pattern(node: dict[str, Any]) -> None:
    """Replace ``node``'s ``minLength``/``maxLength`` by the equivalent ``pattern``."""
    low = node.pop("minLength", 0)
    high = node.pop("maxLength", None)
    low = int(low) if isinstance(low, int | float) and not isinstance(low, bool) else 0
    if isinstance(high, int | float) and not isinstance(high, bool):
        node["pattern"] = f"^{JSON_STRING_UNIT}{{{low},{int(high)}}}$"
    else:
        node["pattern"] = f"^{JSON_STRING_UNIT}{{{low},}}$"


def each_subschema(node: Any) -> Iterator[dict[str, Any]]:
    """``node`` and every object subschema under it (``items``, ``properties``,
    ``$defs``, ``anyOf``, …), depth first, each before its children — so a caller may
    change a node's own keywords as it is yielded. Booleans and other values yield
    nothing."""
    if not isinstance(node, dict):
        return
    yield node
    for key in _ONE:
        yield from each_subschema(node.get(key))
    for key in _MAP:
        sub = node.get(key)
        if isinstance(sub, dict):
            for child in sub.values():
                yield from each_subschema(child)
    for key in _LIST:
        sub = node.get(key)
        if isinstance(sub, list):
            for child in sub:
                yield from each_subschema(child)


def _walk(node: Any) -> None:
    for sub in each_subschema(node):
        if (
            _is_string(sub)
            and ("minLength" in sub or "maxLength" in sub)
            and not any(k in sub for k in _OWN_GRAMMAR)
        ):
            _bounded_pattern(sub)


def json_safe_lengths(schema: Any) -> Any:
    """A copy of ``schema`` (a decoded JSON Schema: dict or bool) in which every string
    schema with ``minLength``/``maxLength`` (and no ``pattern``, ``format``, ``enum`` or
    ``const``) is the equivalent ``pattern`` over JSON-legal characters (see the module
    docstring). Anything else is copied unchanged; the input is not modified."""
    if not isinstance(schema, dict):
        return schema
    out = json.loads(json.dumps(schema))
    _walk(out)
    return out


def json_safe_schema_text(text: str) -> str:
    """:func:`json_safe_lengths` of a schema given as JSON text (compact JSON text back;
    ``text`` itself when nothing changes)."""
    schema = json.loads(text)
    safe = json_safe_lengths(schema)
    return text if safe == schema else json.dumps(safe, separators=(",", ":"))


def json_safe_structural_tag(text: str) -> str:
    """A ``triggered_tags`` structural tag (JSON text) with each tag's ``json_schema``
    through :func:`json_safe_lengths`; other text is returned unchanged."""
    try:
        spec = json.loads(text)
    except ValueError:
        return text
    fmt = spec.get("format", spec) if isinstance(spec, dict) else None
    tags = fmt.get("tags") if isinstance(fmt, dict) else None
    if not isinstance(tags, list):
        return text
    changed = False
    for tag in tags:
        content = tag.get("content") if isinstance(tag, dict) else None
        if isinstance(content, dict) and "json_schema" in content:
            safe = json_safe_lengths(content["json_schema"])
            if safe != content["json_schema"]:
                content["json_schema"] = safe
                changed = True
    return json.dumps(spec, separators=(",", ":")) if changed else text


ANY_DEF = "servehall_any"
"""The ``$defs`` name :func:`bounded_any_values` gives its "any JSON value" schema."""


def _any_value_schema() -> dict[str, Any]:
    """ "Any JSON value" with the numbers of a schema node: ``±NUMBER_BOUND`` (the API
    layer's default bounds), whitespace bounded by the engine as for every value."""
    from servehall.structured.schema import NUMBER_BOUND

    ref = {"$ref": f"#/$defs/{ANY_DEF}"}
    return {
        "anyOf": [
            {"type": "null"},
            {"type": "boolean"},
            {"type": "number", "minimum": -NUMBER_BOUND, "maximum": NUMBER_BOUND},
            {"type": "string"},
            {"type": "array", "items": ref},
            {"type": "object", "additionalProperties": ref},
        ]
    }


def _is_any(node: Any) -> bool:
    return node is True or (isinstance(node, dict) and not node)


def _replace_any(node: Any, ref: dict[str, Any]) -> bool:
    """Point every "any JSON" subschema (``true``, ``{}``) under ``node`` at ``ref``
    (in place); True when one was replaced."""
    if not isinstance(node, dict):
        return False
    found = False
    for key in _ONE:
        if key in node and key != "propertyNames" and _is_any(node[key]):
            node[key] = dict(ref)
            found = True
        else:
            found |= _replace_any(node.get(key), ref)
    for key in _MAP:
        sub = node.get(key)
        if isinstance(sub, dict):
            for name, child in sub.items():
                if _is_any(child):
                    sub[name] = dict(ref)
                    found = True
                else:
                    found |= _replace_any(child, ref)
    for key in _LIST:
        sub = node.get(key)
        if isinstance(sub, list):
            for i, child in enumerate(sub):
                if _is_any(child):
                    sub[i] = dict(ref)
                    found = True
                else:
                    found |= _replace_any(child, ref)
    return found


def bounded_any_values(schema: Any) -> Any:
    """A copy of ``schema`` in which every "any JSON value" (the schema ``true`` or
    ``{}``, ``additionalProperties: true``, ``json_object``'s values) is a reference to
    an explicit any-value schema whose numbers have the default bounds
    (``$defs/servehall_any``). For the engines whose grammar backend compiles the schema
    itself (vLLM's xgrammar, ONNX Runtime's llguidance): their built-in "any JSON"
    numbers take any count of digits, and a weak model writes digits until
    ``max_tokens``. (torch and openvino_cpu cap the same rules in the printed grammar:
    :func:`servehall.structured.grammar.bound_any_numbers`.) Unchanged when there is no
    such value; the input is not modified."""
    if _is_any(schema):
        out: dict[str, Any] = _any_value_schema()
        out["$defs"] = {ANY_DEF: _any_value_schema()}
        return out
    if not isinstance(schema, dict):
        return schema
    out = json.loads(json.dumps(schema))
    if _replace_any(out, {"$ref": f"#/$defs/{ANY_DEF}"}):
        defs = out.setdefault("$defs", {})
        if isinstance(defs, dict):
            defs[ANY_DEF] = _any_value_schema()
        else:
            return json.loads(json.dumps(schema))
    return out
