"""Structured output on ONNX Runtime GenAI: a :class:`~servehall.StructuredConstraint` as
the ``(type, data)`` pair of ``TurnOptions.set_guidance`` (llguidance inside ONNX Runtime
GenAI 0.18; types ``json_schema``, ``regex``, ``lark_grammar``).

* ``json_schema`` → ``json_schema``, objects allowing only their listed ``properties``
  unless ``additionalProperties`` says otherwise (the strict mode the xgrammar engines
  compile with; llguidance would allow any extra key), with llguidance's own options in the schema's
  ``x-guidance`` key: ``whitespace_flexible: false`` and the separators ``", "`` and
  ``": "`` (the bounded whitespace the other engines' xgrammar grammars have;
  ``any_whitespace`` lifts it); "any JSON" values (``json_object``'s) get the number
  bounds of a schema node (:func:`~servehall.structured.json_text.bounded_any_values`;
  llguidance compiles ``minLength``/``maxLength`` over JSON-legal characters itself);
* ``regex`` → ``regex``; ``choice`` → ``regex`` (the strings, escaped, as alternatives);
* an EBNF ``grammar`` (xgrammar/GBNF dialect) and a ``structural_tag`` have no llguidance
  equivalent here (its grammar type is Lark): :class:`GuidanceUnsupported`, which the
  engine turns into a 400 naming the field.

Whether the installed wheel was built with guidance is probed once at load
(:func:`guidance_works`): without it the engine does not list ``structured_output`` and
the host refuses every constraint with 400 ``unsupported_parameter``.
"""

from __future__ import annotations

import json
from typing import Any

from servehall.engines.contract import StructuredConstraint
from servehall.structured.json_text import bounded_any_values, each_subschema

_REGEX_SPECIAL = frozenset("\\.+*?()|[]{}^$#&-~")


class GuidanceUnsupported(ValueError):
    """A constraint ONNX Runtime GenAI's guidance cannot express (the request gets a 400)."""


def escape_regex(text: str) -> str:
    """``text`` as a literal in llguidance's (Rust ``regex``) syntax: only its
    metacharacters are escaped (Python's ``re.escape`` also escapes a space, which Rust's
    syntax refuses)."""
    return "".join("\\" + ch if ch in _REGEX_SPECIAL else ch for ch in text)


def _strict_objects(node: Any) -> None:
    """Set ``additionalProperties: false`` (in place) on every object schema with
    ``properties`` that says nothing about extra keys."""
    for sub in each_subschema(node):
        if "properties" in sub and not {"additionalProperties", "unevaluatedProperties"} & set(sub):
            sub["additionalProperties"] = False


def guidance_of(c: StructuredConstraint) -> tuple[str, str]:
    """The ``set_guidance(type, data)`` arguments for ``c`` (see the module docstring).

    Raises:
        GuidanceUnsupported: a ``grammar`` or ``structural_tag`` constraint.
    """
    if c.json_schema is not None:
        schema: Any = bounded_any_values(json.loads(c.json_schema))
        _strict_objects(schema)
        if not c.any_whitespace:
            schema = {
                **schema,
                "x-guidance": {
                    "whitespace_flexible": False,
                    "item_separator": ", ",
                    "key_separator": ": ",
                },
            }
        return "json_schema", json.dumps(schema)
    if c.regex is not None:
        return "regex", c.regex
    if c.choice is not None:
        return "regex", "(" + "|".join(escape_regex(s) for s in c.choice) + ")"
    if c.grammar is not None:
        raise GuidanceUnsupported(
            "an EBNF grammar is not supported by the ONNX Runtime GenAI engine (its guidance "
            "takes Lark grammars); use a JSON Schema or a regex"
        )
    raise GuidanceUnsupported(
        "this decoding constraint (a triggered tool-call structure: tool_choice 'auto' with "
        "strict tools) is not supported by the ONNX Runtime GenAI engine"
    )


def guidance_works(og: Any, engine: Any) -> bool:
    """Whether this ONNX Runtime GenAI build applies guidance: ``set_guidance`` on a
    throwaway request's turn options succeeds (a build without llguidance raises)."""
    if not hasattr(og.TurnOptions, "set_guidance"):
        return False
    request = engine.create_request()
    try:
        og.TurnOptions(request).set_guidance("regex", "a")
    except Exception:
        return False
    finally:
        request.close()
    return True
