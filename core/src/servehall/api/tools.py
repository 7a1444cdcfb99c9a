"""The ``tools`` side of a chat request, checked once in the API layer: what crosses
fields, which the pydantic models cannot say (all 400 ``invalid_request_error`` with
``param`` naming the field, OpenAI's envelope):

* ``tools[i].function.parameters`` must be a valid JSON Schema (checked by
  :func:`~servehall.structured.schema.check_json_schema`, against the meta-schema of its
  ``$schema``, 2020-12 by default) of an object;
* function names are unique;
* ``tool_choice`` ``required`` or a named function needs ``tools``, and the name must
  be one of them;
* a ``tool`` message answers an earlier assistant ``tool_calls[].id``
  (``messages[i].tool_call_id``).

These refusals carry ``code`` :data:`~servehall.tools.plan.TOOLS_CODE` (``invalid_tools``):
rules across fields that a static schema (``/openapi.json``) cannot state.
"""

from __future__ import annotations

import json
from typing import Any

from servehall.api.wire import ChatPromptRequest, NamedToolChoice, ToolMessage
from servehall.errors import InvalidRequestError
from servehall.structured.schema import check_json_schema
from servehall.tools.plan import TOOLS_CODE, FunctionTool, ToolChoiceKind, ToolPlan


def check_parameters(schema: dict[str, Any], param: str) -> None:
    """400 naming ``param`` unless ``schema`` is a valid JSON Schema of an object (the
    one checker, :func:`~servehall.structured.schema.check_json_schema`, validity and
    shape only: what a grammar cannot enforce is refused only for the tools whose schema
    constrains decoding, in :meth:`~servehall.tools.plan.ToolPlan.constraint`)."""
    declared = schema.get("type")
    if declared is not None and declared != "object":
        raise InvalidRequestError(
            f"Function parameters must be a JSON Schema of type 'object', not {declared!r}.",
            param=param,
            code=TOOLS_CODE,
        )
    check_json_schema(schema, param, decoding=False, code=TOOLS_CODE)


def tool_plan(req: ChatPromptRequest) -> ToolPlan:
    """The request's :class:`~servehall.tools.plan.ToolPlan` (``choice`` ``none`` when it
    has no tools), after the checks of the module docstring.

    Raises:
        InvalidRequestError: the first failed check, ``param`` naming the field.
    """
    tools: list[FunctionTool] = []
    seen: set[str] = set()
    for i, t in enumerate(req.tools or []):
        fn = t.function
        if fn.name in seen:
            raise InvalidRequestError(
                f"Tool name '{fn.name}' is declared twice.",
                param=f"tools[{i}].function.name",
                code=TOOLS_CODE,
            )
        seen.add(fn.name)
        if fn.parameters is not None:
            check_parameters(fn.parameters, f"tools[{i}].function.parameters")
        tools.append(FunctionTool(fn.name, fn.parameters, fn.description, bool(fn.strict)))
    choice: ToolChoiceKind
    named: str | None = None
    tc = req.tool_choice
    if isinstance(tc, NamedToolChoice):
        choice, named = "named", tc.function.name
        if named not in seen:
            raise InvalidRequestError(
                f"tool_choice names function '{named}', which is not in tools.",
                param="tool_choice",
                code=TOOLS_CODE,
            )
    elif tc is None:
        choice = "auto" if tools else "none"
    else:
        choice = tc
        if choice == "required" and not tools:
            raise InvalidRequestError(
                "tool_choice 'required' needs at least one tool.",
                param="tool_choice",
                code=TOOLS_CODE,
            )
    _check_tool_messages(req)
    parallel = True if req.parallel_tool_calls is None else req.parallel_tool_calls
    return ToolPlan(tuple(tools), choice, named, parallel)


def _check_tool_messages(req: ChatPromptRequest) -> None:
    ids: set[str] = set()
    for i, m in enumerate(req.messages):
        if m.role == "assistant" and m.tool_calls:
            ids.update(c.id for c in m.tool_calls)
        elif isinstance(m, ToolMessage) and m.tool_call_id not in ids:
            raise InvalidRequestError(
                f"messages[{i}] answers tool call '{m.tool_call_id[:64]}', which no earlier "
                "assistant message made.",
                param=f"messages[{i}].tool_call_id",
                code=TOOLS_CODE,
            )


def template_arguments(arguments: str) -> Any:
    """An earlier call's ``arguments`` as chat templates expect them: the JSON object
    (transformers' convention), or the text as sent when it is not one."""
    try:
        value = json.loads(arguments)
    except ValueError:
        return arguments
    return value if isinstance(value, dict) else arguments
