"""A corpus of JSON Schemas every request field that carries one must refuse with 400.

Used by the schema checker's tests, the structured-output e2e tests and the accounting
soak (hostile inputs). Each entry is ``(schema, why)``; every schema is a JSON object
(so it is also a well-formed ``tools[i].function.parameters`` value) and none declares a
``type`` other than ``object`` where it has one at the root, so the refusal is the
schema's, not the tool's shape.

* :data:`BAD_SCHEMAS`: invalid or malformed schemas, refused wherever they appear
  (``response_format.json_schema.schema``, ``guided_json``, ``structured_outputs.json``,
  and ``tools[i].function.parameters`` even when the tool only reaches the prompt);
* :data:`UNENFORCEABLE_SCHEMAS`: valid schemas that a grammar cannot enforce, refused
  where they constrain decoding (structured outputs, a forced or ``strict`` tool) and
  accepted on a tool that only reaches the prompt (``tool_choice: "auto"``, not strict).

:func:`schema_bodies` puts a schema into each request field that carries one.
"""

from __future__ import annotations

from typing import Any

DRAFT_07 = "http://json-schema.org/draft-07/schema#"


BAD_SCHEMAS: list[tuple[dict[str, Any], str]] = [
    ({"$schema": {}}, "'$schema' is an object (unhashable in the dialect lookup)"),
    ({"$schema": [1]}, "'$schema' is a list"),
    ({"$schema": 5}, "'$schema' is a number"),
    ({"$schema": DRAFT_07, "$defs": {"a": {"type": 5}}}, "draft-07 '$defs' entry, bad type"),
    (
        {"$schema": DRAFT_07, "$defs": {"a": {"type": "integer", "minimum": "x"}}},
        "draft-07 '$defs' entry, string minimum",
    ),
    (
        {
            "$schema": DRAFT_07,
            "$defs": {"a": {"type": "object", "properties": {"b": {"maxLength": -1}}}},
        },
        "draft-07 '$defs' entry, negative maxLength deeper down",
    ),
    ({"$schema": DRAFT_07, "$defs": 5}, "draft-07 non-object '$defs'"),
    ({"$schema": DRAFT_07, "$defs": [{"type": "object"}]}, "draft-07 '$defs' is a list"),
    ({"type": "object", "$defs": 5}, "non-object '$defs'"),
    ({"definitions": {"a": {"type": 5}}}, "'definitions' entry, bad type"),
    ({"type": "object", "properties": 3}, "'properties' is a number"),
    ({"type": "object", "properties": {"a": 3}}, "a property schema is a number"),
    ({"type": "object", "properties": {"a": {"type": "float"}}}, "unknown type name"),
    ({"type": "object", "properties": {"a": {"type": []}}}, "empty type list"),
    ({"type": "object", "required": "a"}, "'required' is a string"),
    ({"type": "object", "required": [1]}, "'required' holds a number"),
    ({"type": "object", "properties": {"a": {"enum": 3}}}, "'enum' is a number"),
    ({"type": "object", "properties": {"a": {"anyOf": []}}}, "empty 'anyOf'"),
    ({"type": "object", "properties": {"a": {"anyOf": {"type": "string"}}}}, "'anyOf' object"),
    (
        {"type": "object", "properties": {"a": {"type": "string", "minLength": "1"}}},
        "string 'minLength'",
    ),
    (
        {"type": "object", "properties": {"a": {"type": "integer", "exclusiveMinimum": "x"}}},
        "string 'exclusiveMinimum'",
    ),
    ({"type": "object", "properties": {"a": {"type": "string", "pattern": 5}}}, "numeric pattern"),
    ({"type": "object", "properties": {"a": {"$ref": 5}}}, "numeric '$ref'"),
    ({"type": "object", "properties": {"a": {"items": 5}}}, "'items' is a number"),
    (
        {"$schema": DRAFT_07, "type": "object", "prefixItems": [{"type": 5}]},
        "draft-07 'prefixItems' entry, bad type",
    ),
    (
        {"type": "object", "properties": {"a": {"type": "integer", "minimum": True}}},
        "boolean 'minimum'",
    ),
]
"""Invalid or malformed schemas (see the module docstring)."""

UNENFORCEABLE_SCHEMAS: list[tuple[dict[str, Any], str]] = [
    ({"type": "object", "minProperties": 1}, "'minProperties' is not enforced by the grammar"),
    (
        {"type": "object", "properties": {"a": {"type": "array", "uniqueItems": True}}},
        "'uniqueItems'",
    ),
    ({"type": "object", "properties": {"a": {"not": {"type": "string"}}}}, "'not'"),
    (
        {"type": "object", "properties": {"a": {"type": "number", "exclusiveMinimum": 0}}},
        "'exclusiveMinimum' on a number",
    ),
    (
        {"type": "object", "properties": {"a": {"type": "string", "format": "ipv5"}}},
        "unknown string format",
    ),
    (
        {"type": "object", "properties": {"a": {"$ref": "https://example.com/s.json"}}},
        "remote '$ref'",
    ),
    ({"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}}, "unresolved '$ref'"),
]
"""Valid schemas a grammar cannot enforce (see the module docstring)."""


def schema_bodies(schema: Any, model: str) -> list[tuple[str, dict[str, Any]]]:
    """``schema`` in each request field that carries a schema: ``(param, chat body)``
    pairs, ``param`` being the field a 400 must name (the tool is forced by name, so its
    schema constrains decoding)."""
    messages = [{"role": "user", "content": "Answer in JSON."}]
    base: dict[str, Any] = {"model": model, "messages": messages, "max_tokens": 8}
    tool = {"type": "function", "function": {"name": "f", "parameters": schema}}
    return [
        (
            "response_format.json_schema.schema",
            {
                **base,
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "s", "schema": schema},
                },
            },
        ),
        ("guided_json", {**base, "guided_json": schema}),
        ("structured_outputs.json", {**base, "structured_outputs": {"json": schema}}),
        (
            "tools[0].function.parameters",
            {
                **base,
                "tools": [tool],
                "tool_choice": {"type": "function", "function": {"name": "f"}},
            },
        ),
    ]


_DIALECTS = (
    "https://json-schema.org/draft/2020-12/schema",
    "https://json-schema.org/draft/2019-09/schema",
    DRAFT_07,
    "http://json-schema.org/draft-06/schema#",
    "http://json-schema.org/draft-04/schema#",
    "http://example.com/unknown-dialect",
)
_TYPE_NAMES = ("null", "boolean", "object", "array", "number", "string", "integer", "float")
_ONE_KEYS = ("items", "additionalProperties", "not", "if", "then", "else", "contains")
_MAP_KEYS = ("properties", "$defs", "definitions", "patternProperties", "dependentSchemas")
_LIST_KEYS = ("anyOf", "oneOf", "allOf", "prefixItems")
_NUMBER_KEYS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf")
_COUNT_KEYS = ("minLength", "maxLength", "minItems", "maxItems", "minProperties")


def json_schemas(max_leaves: int = 24) -> Any:
    """A hypothesis strategy of JSON Schemas, valid and malformed: objects of 0-4
    keywords drawn from what the checker and the grammar backends read, each value
    usually of the right JSON type and sometimes any JSON value; subschemas nest. Needs
    ``hypothesis`` (a test dependency; imported here, not at module import).

    Returns:
        ``SearchStrategy[dict | bool]``.
    """
    from hypothesis import strategies as st

    scalars = (
        st.none()
        | st.booleans()
        | st.integers(-(10**20), 10**20)
        | st.floats(allow_nan=False, allow_infinity=False)
        | st.text(max_size=6)
    )
    any_json = st.recursive(
        scalars,
        lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=4), c, max_size=3),
        max_leaves=6,
    )
    names = st.text("abcxyz", min_size=1, max_size=3)
    type_names = st.sampled_from(_TYPE_NAMES)

    def objects(children: Any) -> Any:
        values: dict[str, Any] = {
            "type": type_names | st.lists(type_names, max_size=3) | any_json,
            "required": st.lists(names, max_size=3) | any_json,
            "enum": st.lists(scalars, max_size=3) | any_json,
            "const": any_json,
            "pattern": st.sampled_from(["^a+$", "[0-9]{2}", "(", "a{2,1}"]) | any_json,
            "format": st.sampled_from(["date", "email", "uuid", "ipv5"]) | any_json,
            "$ref": st.sampled_from(
                ["#", "#/$defs/a", "#/definitions/a", "#/properties/a", "#/nope", "http://x/s"]
            )
            | any_json,
            "$schema": st.sampled_from(_DIALECTS) | any_json,
            "uniqueItems": st.booleans(),
        }
        for key in _ONE_KEYS:
            values[key] = children | any_json
        for key in _MAP_KEYS:
            values[key] = st.dictionaries(names, children, max_size=3) | any_json
        for key in _LIST_KEYS:
            values[key] = st.lists(children, max_size=3) | any_json
        for key in _NUMBER_KEYS:
            values[key] = (
                st.integers(-(10**18), 10**18) | st.floats(-1e20, 1e20) | st.booleans() | any_json
            )
        for key in _COUNT_KEYS:
            values[key] = st.integers(-2, 20) | any_json
        keys = st.lists(st.sampled_from(sorted(values)), max_size=4, unique=True)
        return keys.flatmap(lambda ks: st.fixed_dictionaries({k: values[k] for k in ks}))

    return st.recursive(st.booleans() | st.just({}), objects, max_leaves=max_leaves)
