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
* it nests deeper than :data:`MAX_DEPTH` or its text exceeds :data:`MAX_SCHEMA_CHARS`;
* a keyword read by this module, the grammar backends or a chat template has the wrong
  JSON type (``type``, the numeric bounds, the counts, ``pattern``, ``format``,
  ``required``, ``enum``, the subschema maps and lists), wherever it is — also where the
  dialect's meta-schema does not look: under draft 3-7, the entries of ``$defs`` (and
  ``prefixItems`` …) are checked against that draft's meta-schema one by one;
* anything else fails while it is read (a validator's ``TypeError`` on a malformed
  keyword, a ``RecursionError``): every failure is the client's 400, never a 500.

The same checker reads ``response_format.json_schema.schema``, ``guided_json``,
``structured_outputs.json`` and ``tools[i].function.parameters`` (tools whose schema
only reaches the prompt are checked with ``decoding=False``: validity and shape only).

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
_ONE = (
    "items",
    "additionalProperties",
    "unevaluatedProperties",
    "propertyNames",
    "additionalItems",
    "contains",
    "not",
    "if",
    "then",
    "else",
)
_MAP = ("properties", "$defs", "definitions", "patternProperties", "dependentSchemas")
_LIST = ("anyOf", "oneOf", "allOf", "prefixItems")
_TYPES = frozenset({"null", "boolean", "object", "array", "number", "string", "integer"})
_NUMBERS = ("minimum", "maximum", "multipleOf")
_EXCLUSIVE = ("exclusiveMinimum", "exclusiveMaximum")
_COUNTS = (
    "minLength",
    "maxLength",
    "minItems",
    "maxItems",
    "minProperties",
    "maxProperties",
    "minContains",
    "maxContains",
)
_STRINGS = ("$schema", "$ref", "pattern", "format")
#: Keywords holding subschemas that drafts 3-7 do not know, so their meta-schemas leave
#: them unchecked: checked here with the dialect's meta-schema one subschema at a time.
_LATER_KEYWORDS = ("$defs", "prefixItems", "dependentSchemas", "unevaluatedProperties")
_DRAFTS_BEFORE_2019 = frozenset(
    {"Draft3Validator", "Draft4Validator", "Draft6Validator", "Draft7Validator"}
)


def _refuse(param: str, where: str, message: str, code: str | None = None) -> InvalidRequestError:
    at = f" at '{where}'" if where else ""
    return InvalidRequestError(
        f"Invalid schema for '{param}'{at}: {message}", param=param, code=code
    )


def check_json_schema(
    schema: Any, param: str, *, decoding: bool = True, code: str | None = None
) -> dict[str, Any] | bool:
    """Validate ``schema`` and return its normalised copy (see the module docstring).

    The one checker of every JSON Schema a request carries (``response_format``,
    ``guided_json``, ``structured_outputs.json``, ``tools[i].function.parameters``). Any
    failure while reading the schema (jsonschema's ``SchemaError``, a ``TypeError`` from a
    validator on a malformed keyword, too deep a nesting …) is the client's: a 400, never
    another exception.

    Args:
        schema: the decoded schema (a dict or a boolean).
        param: the request field that carried it, for the error's ``param``.
        decoding: the schema constrains decoding: refuse what the grammar backend would
            weaken and normalise bounds (module docstring). False (the schema of a tool
            that is only rendered into the prompt): check validity and shape only, and
            return an unchanged copy.
        code: the error's ``code`` (``invalid_tools`` for tool parameters).

    Returns:
        The normalised schema (a new object; the input is not changed).

    Raises:
        InvalidRequestError: 400 naming ``param``; the message names the JSON pointer of
            the offending keyword.
    """
    try:
        return _Checker(param, decoding, code).check(schema)
    except InvalidRequestError:
        raise
    except RecursionError:
        raise _refuse(param, "", f"the schema nests deeper than {MAX_DEPTH} levels", code) from None
    except Exception as exc:  # a validator choking on a malformed keyword: the client's
        detail = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ""
        raise _refuse(
            param, "", f"the schema cannot be read ({type(exc).__name__}: {detail})", code
        ) from None


class _Checker:
    """One schema's check (see :func:`check_json_schema`)."""

    def __init__(self, param: str, decoding: bool, code: str | None) -> None:
        self.param = param
        self.decoding = decoding
        self.code = code
        self.cls: Any = None
        self.root: dict[str, Any] = {}

    def refuse(self, where: str, message: str) -> InvalidRequestError:
        return _refuse(self.param, where, message, self.code)

    def check(self, schema: Any) -> dict[str, Any] | bool:
        import jsonschema

        if schema is False:
            if not self.decoding:
                return False
            raise self.refuse("", "the schema 'false' matches nothing")
        if schema is True:
            return True
        if not isinstance(schema, dict):
            raise self.refuse("", "a JSON Schema must be an object or a boolean")
        text = json.dumps(schema, separators=(",", ":"))
        if len(text) > MAX_SCHEMA_CHARS:
            raise self.refuse("", f"the schema is longer than {MAX_SCHEMA_CHARS} characters")
        dialect = schema.get("$schema")
        if dialect is not None and not isinstance(dialect, str):
            raise self.refuse("/$schema", "'$schema' must be a URI string")
        self.cls = jsonschema.validators.validator_for(
            schema, default=jsonschema.Draft202012Validator
        )
        self.meta_check(schema, "")
        out = json.loads(text)  # a private copy to normalise
        self.root = out
        self.walk(out, "", 0)
        return out

    def meta_check(self, schema: Any, where: str) -> None:
        """``schema`` against the meta-schema of the request's dialect."""
        import jsonschema

        try:
            self.cls.check_schema(schema)
        except jsonschema.SchemaError as exc:
            path = "/".join(str(p) for p in exc.path)
            raise self.refuse(f"{where}/{path}" if path else where, exc.message[:300]) from None

    def walk(self, node: Any, where: str, depth: int) -> None:
        if depth > MAX_DEPTH:
            raise self.refuse(where, f"the schema nests deeper than {MAX_DEPTH} levels")
        if isinstance(node, bool):
            return
        if not isinstance(node, dict):
            raise self.refuse(where, "a subschema must be an object or a boolean")
        self.shape(node, where)
        if self.cls.__name__ in _DRAFTS_BEFORE_2019:
            self.later_keywords(node, where)
        if self.decoding:
            self.grammar_rules(node, where)
        for key in _ONE:
            sub = node.get(key)
            if isinstance(sub, list) and key == "items":  # drafts before 2020-12: a tuple
                for i, child in enumerate(sub):
                    self.walk(child, f"{where}/{key}/{i}", depth + 1)
            elif key in node:
                self.walk(sub, f"{where}/{key}", depth + 1)
        for key in _MAP:
            for name, child in node.get(key, {}).items():
                self.walk(child, f"{where}/{key}/{name}", depth + 1)
        for key in _LIST:
            for i, child in enumerate(node.get(key, ())):
                self.walk(child, f"{where}/{key}/{i}", depth + 1)

    def shape(self, node: dict[str, Any], where: str) -> None:
        """The keywords this module, the grammar backends and the chat templates read
        have the JSON types the specification gives them (whatever the dialect, and
        also where its meta-schema does not look)."""
        if "type" in node:
            t = node["type"]
            names = [t] if isinstance(t, str) else t
            if (
                not isinstance(names, list)
                or not names
                or not all(isinstance(n, str) and n in _TYPES for n in names)
            ):
                raise self.refuse(
                    f"{where}/type",
                    f"'type' must be one of {sorted(_TYPES)} or a non-empty list of them",
                )
        for key in _NUMBERS:
            if key in node and not _is_number(node[key]):
                raise self.refuse(f"{where}/{key}", f"'{key}' must be a finite number")
        for key in _EXCLUSIVE:  # a boolean in draft 4
            if key in node and not (_is_number(node[key]) or isinstance(node[key], bool)):
                raise self.refuse(f"{where}/{key}", f"'{key}' must be a finite number")
        for key in _COUNTS:
            v = node.get(key)
            if key in node and (not isinstance(v, int) or isinstance(v, bool) or v < 0):
                raise self.refuse(f"{where}/{key}", f"'{key}' must be a non-negative integer")
        for key in _STRINGS:
            if key in node and not isinstance(node[key], str):
                raise self.refuse(f"{where}/{key}", f"'{key}' must be a string")
        req = node.get("required")
        if "required" in node and not (
            isinstance(req, list) and all(isinstance(r, str) for r in req)
        ):
            raise self.refuse(f"{where}/required", "'required' must be a list of strings")
        if "enum" in node and not isinstance(node["enum"], list):
            raise self.refuse(f"{where}/enum", "'enum' must be a list")
        for key in _MAP:
            if key in node and not isinstance(node[key], dict):
                raise self.refuse(f"{where}/{key}", f"'{key}' must be an object of schemas")
        for key in _LIST:
            if key in node and not (isinstance(node[key], list) and node[key]):
                raise self.refuse(f"{where}/{key}", f"'{key}' must be a non-empty list of schemas")

    def later_keywords(self, node: dict[str, Any], where: str) -> None:
        """Under draft 3-7, the subschemas of :data:`_LATER_KEYWORDS` (which the grammar
        backends read) against the dialect's meta-schema."""
        for key in _LATER_KEYWORDS:
            sub = node.get(key)
            if isinstance(sub, dict) and key != "unevaluatedProperties":
                children = [(f"{where}/{key}/{k}", v) for k, v in sub.items()]
            elif isinstance(sub, list):
                children = [(f"{where}/{key}/{i}", v) for i, v in enumerate(sub)]
            elif key in node:
                children = [(f"{where}/{key}", sub)]
            else:
                continue
            for at, child in children:
                if isinstance(child, dict):
                    self.meta_check(child, at)

    def grammar_rules(self, node: dict[str, Any], where: str) -> None:
        """What the grammar backend would weaken is refused; bounds are normalised."""
        for key in WEAKENED_KEYWORDS:
            if key in node:
                raise self.refuse(f"{where}/{key}", f"'{key}' cannot be enforced while decoding")
        if isinstance(node.get("allOf"), list) and len(node["allOf"]) > 1:
            raise self.refuse(
                f"{where}/allOf", "'allOf' with more than one schema is not supported"
            )
        if "pattern" in node and ("minLength" in node or "maxLength" in node):
            raise self.refuse(
                f"{where}/pattern",
                "'pattern' together with 'minLength'/'maxLength' is not supported",
            )
        fmt = node.get("format")
        if isinstance(fmt, str) and fmt not in SUPPORTED_FORMATS:
            raise self.refuse(f"{where}/format", f"string format '{fmt}' is not supported")
        _exclusive_bounds(node, where, self.param, self.code)
        _default_bounds(node)
        ref = node.get("$ref")
        if ref is not None:
            _check_ref(ref, self.root, f"{where}/$ref", self.param, self.code)


def _is_number(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return True
    return isinstance(value, float) and math.isfinite(value)


def _exclusive_bounds(node: dict[str, Any], where: str, param: str, code: str | None) -> None:
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
                code,
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


def _check_ref(ref: Any, root: dict[str, Any], where: str, param: str, code: str | None) -> None:
    if not isinstance(ref, str) or not (ref == "#" or ref.startswith("#/")):
        raise _refuse(
            param, where, f"only local references ('#/...') are supported, not {ref!r}", code
        )
    node: Any = root
    for raw in ref[2:].split("/") if ref != "#" else ():
        part = raw.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            raise _refuse(param, where, f"reference {ref!r} does not resolve", code)
