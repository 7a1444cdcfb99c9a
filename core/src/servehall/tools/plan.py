"""What a chat request's tools ask for (:class:`ToolPlan`): which stream reads each
choice's output, and which decoding constraint, if any, enforces the tool choice.

Constraints (the engine-neutral :class:`~servehall.engine.StructuredConstraint`):

* a named function: ``json_schema`` = the function's ``parameters`` (the output is the
  arguments object; always valid against the schema);
* ``required``: ``json_schema`` = an array of ``{"name": <enum of one tool>,
  "parameters": <its schema>}`` items, ``minItems`` 1 (``maxItems`` 1 with
  ``parallel_tool_calls: false``); the tools' ``$defs`` (and ``definitions``) are hoisted
  to the root so their ``$ref`` still resolve;
* ``auto`` with a ``strict`` tool or ``parallel_tool_calls: false``: a ``structural_tag``
  in xgrammar's format — free text until the parser's trigger (``<tool_call>``), then one
  of the tools' call texts with schema-constrained arguments (``strict`` tools: their
  schema; others: any object), ``stop_after_first`` for at most one call;
* ``auto`` under the model's ``tool_call_grammar = "always"`` (:data:`ToolGrammar`): the
  same structural tag for every request with tools (a "lazy grammar", as llama.cpp's
  grammar triggers and xgrammar's ``triggered_tags``), every tool's arguments by its
  checked schema (a non-strict tool whose schema the checker refuses: any object),
  ``stop_after_first`` only with ``parallel_tool_calls: false``;
* ``auto`` otherwise, and ``none``: no constraint.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

from servehall.engines.contract import StructuredConstraint
from servehall.errors import InvalidRequestError
from servehall.structured.schema import check_json_schema
from servehall.tools.calls import IdFactory, ToolCallStream, new_call_id
from servehall.tools.forced import REQUIRED_FORMAT, NamedCallStream
from servehall.tools.parsers import ToolParser
from servehall.tools.scanner import JsonCallStream

ANY_OBJECT: dict[str, Any] = {"type": "object"}
TOOLS_CODE = "invalid_tools"
"""The ``code`` of a 400 for tools that break a rule across fields (an unknown name in
``tool_choice``, an unmatched ``tool_call_id``, an invalid ``parameters`` schema …)."""


@dataclass(frozen=True, slots=True)
class FunctionTool:
    """One ``tools[]`` entry of type ``function`` (``parameters``: a JSON Schema)."""

    name: str
    parameters: dict[str, Any] | None = None
    description: str | None = None
    strict: bool = False

    def template(self) -> dict[str, Any]:
        """The tool as ``apply_chat_template(tools=[...])`` takes it (OpenAI's shape)."""
        fn: dict[str, Any] = {"name": self.name}
        if self.description is not None:
            fn["description"] = self.description
        fn["parameters"] = self.parameters if self.parameters is not None else ANY_OBJECT
        return {"type": "function", "function": fn}

    @property
    def schema(self) -> dict[str, Any]:
        """The arguments' schema (any object when ``parameters`` is absent)."""
        return self.parameters if self.parameters is not None else ANY_OBJECT


ToolChoiceKind = Literal["none", "auto", "required", "named"]
ToolGrammar = Literal["strict", "always"]
"""``[[models]] tool_call_grammar``: when ``auto`` gets a structural tag (module docstring)."""


@dataclass(frozen=True, slots=True)
class ToolPlan:
    """The tools of one chat request and how they are chosen.

    Attributes:
        tools: the declared functions, in request order.
        choice: ``none``, ``auto``, ``required`` or ``named`` (``named`` is the function).
        named: the function a named choice forces.
        parallel: ``parallel_tool_calls`` (default true).
    """

    tools: tuple[FunctionTool, ...]
    choice: ToolChoiceKind = "auto"
    named: str | None = None
    parallel: bool = True

    @property
    def active(self) -> bool:
        """False for ``tool_choice: "none"`` (or no tools): the output is plain text."""
        return self.choice != "none" and bool(self.tools)

    @property
    def forced(self) -> bool:
        """A call is forced (``required`` or a named function): the whole output is the
        call, shaped by the tools' schemas."""
        return self.choice in ("named", "required") and bool(self.tools)

    def stream(self, parser: ToolParser, new_id: IdFactory = new_call_id) -> ToolCallStream:
        """The per-choice stream reading the output for this choice kind."""
        if self.choice == "named":
            assert self.named is not None
            return NamedCallStream(self.named, new_id)
        if self.choice == "required":
            return JsonCallStream(REQUIRED_FORMAT, new_id)
        return parser.stream(new_id)

    def constraint_param(self) -> str:
        """The request field that asks for a constraint (for a 400 that names it)."""
        if self.choice in ("named", "required"):
            return "tool_choice"
        if not self.parallel:
            return "parallel_tool_calls"
        return "tools"

    def constraint(
        self, parser: ToolParser, grammar: ToolGrammar = "strict"
    ) -> StructuredConstraint | None:
        """The decoding constraint this plan needs (see the module docstring), or None.

        ``grammar`` is the model's ``tool_call_grammar``: ``"always"`` constrains every
        ``auto`` call after the parser's trigger.

        Raises:
            InvalidRequestError: code ``invalid_tools``: a schema the grammar cannot
                enforce (param ``tools[i].function.parameters``, by the checker of
                ``response_format``); two tools define one ``$defs`` name differently
                (param ``tools``; ``required`` needs them at the schema root).
        """
        if not self.active:
            return None
        if self.choice == "named":
            i = next(i for i, t in enumerate(self.tools) if t.name == self.named)
            return StructuredConstraint(json_schema=_dumps(self.checked_schema(i)))
        if self.choice == "required":
            return StructuredConstraint(json_schema=_dumps(self.required_schema()))
        always = grammar == "always"
        if self.parallel and not always and not any(t.strict for t in self.tools):
            return None
        tags = [
            {
                "type": "tag",
                "begin": parser.call_begin(t.name),
                "content": {"type": "json_schema", "json_schema": self._tag_schema(i, always)},
                "end": parser.end,
            }
            for i, t in enumerate(self.tools)
        ]
        tag = {
            "type": "structural_tag",
            "format": {
                "type": "triggered_tags",
                "triggers": [parser.trigger],
                "tags": tags,
                "at_least_one": False,
                "stop_after_first": not self.parallel,
            },
        }
        return StructuredConstraint(structural_tag=_dumps(tag))

    def _tag_schema(self, i: int, always: bool) -> Any:
        """Tool ``i``'s arguments schema inside the structural tag: checked for a
        ``strict`` tool (a schema the checker refuses is a 400), checked for any tool
        under ``always`` (refused: any object, as without the setting), else any object."""
        if self.tools[i].strict:
            return self.checked_schema(i)
        if not always:
            return ANY_OBJECT
        try:
            return self.checked_schema(i)
        except InvalidRequestError:
            return ANY_OBJECT

    def checked_schema(self, i: int) -> Any:
        """Tool ``i``'s arguments schema as it constrains decoding: checked and
        normalised by :func:`~servehall.structured.schema.check_json_schema` (the
        checker of ``response_format``).

        Raises:
            InvalidRequestError: param ``tools[i].function.parameters``, code
                ``invalid_tools``.
        """
        return check_json_schema(
            self.tools[i].schema, f"tools[{i}].function.parameters", code=TOOLS_CODE
        )

    def required_schema(self) -> dict[str, Any]:
        """The JSON Schema of ``tool_choice: "required"`` output (module docstring), of
        the checked tool schemas (:meth:`checked_schema`)."""
        defs: dict[str, dict[str, Any]] = {}
        items = []
        for i, t in enumerate(self.tools):
            checked = self.checked_schema(i)
            params = dict(checked) if isinstance(checked, dict) else {}
            for key in ("$defs", "definitions"):
                hoisted = defs.setdefault(key, {})
                for name, sub in (params.pop(key, None) or {}).items():
                    if name in hoisted and hoisted[name] != sub:
                        raise InvalidRequestError(
                            f"Tools define '{key}/{name}' differently; tool_choice "
                            "'required' needs one definition per name.",
                            param="tools",
                            code=TOOLS_CODE,
                        )
                    hoisted[name] = sub
            items.append(
                {
                    "type": "object",
                    "properties": {
                        "name": {"type": "string", "enum": [t.name]},
                        "parameters": params,
                    },
                    "required": ["name", "parameters"],
                    "additionalProperties": False,
                }
            )
        schema: dict[str, Any] = {"type": "array", "minItems": 1, "items": {"anyOf": items}}
        if not self.parallel:
            schema["maxItems"] = 1
        schema.update({key: sub for key, sub in defs.items() if sub})
        return schema


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
