"""The request body of OpenAI's Responses API (``POST /v1/responses``), as servehall
serves it; the answers' shapes are built in :mod:`servehall.api.responses_translate`.

Validation policy (on top of :mod:`servehall.api.wire`'s: strict numbers, the same
bounds for ``temperature``, ``top_p``, ``max_output_tokens`` ≥ 1, function names):

* ``input`` is a string or a non-empty list of items: messages (``{role, content}``,
  ``type: "message"`` optional; roles ``user``, ``system``, ``developer``, ``assistant``;
  content a string or ``input_text`` / ``output_text`` parts), ``function_call``
  (``call_id``, ``name``, ``arguments``) and ``function_call_output`` (``call_id``,
  ``output`` a string or text parts). ``input`` may be left out only with
  ``previous_response_id``;
* ``tools`` are function tools in the Responses' flat shape (``{type: "function", name,
  description, parameters, strict}``); ``tool_choice`` is ``none``, ``auto``,
  ``required`` or ``{type: "function", name}``;
* ``text.format`` is ``{type: "text"}``, ``{type: "json_object"}`` or ``{type:
  "json_schema", name, schema, strict, description}``;
* ``metadata``: at most 16 string pairs, keys ≤ 64 and values ≤ 512 characters.

What servehall does not implement is refused with 400 ``unsupported_parameter`` naming
the field (:func:`check_unsupported_fields`): ``reasoning``, built-in tools
(``web_search``, ``file_search``, ``code_interpreter``, ``computer_use_preview``,
``image_generation``, ``mcp`` …) and tool choices that name them, ``background: true``,
``include`` values, ``conversation``, ``prompt``, ``top_logprobs``, ``max_tool_calls``,
``truncation: "auto"``, and input items or content parts other than those above
(images, files, reasoning items, item references).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from servehall.api.wire import (
    MaxTokens,
    StrictText,
    Temperature,
    ToolCallId,
    ToolName,
    TopP,
    asks_for_nothing,
)
from servehall.errors import UnsupportedParameterError

StrictBool = Annotated[bool, Field(strict=True)]

#: Known Responses fields servehall does not implement, with the values that ask for
#: nothing (see :func:`servehall.api.wire.asks_for_nothing`).
UNSUPPORTED_FIELDS: dict[str, tuple[Any, ...]] = {
    "background": (False,),
    "conversation": (),
    "include": ([],),
    "prompt": (),
    "top_logprobs": (0,),
    "max_tool_calls": (),
    "truncation": ("disabled",),
}

INPUT_ITEM_TYPES = ("message", "function_call", "function_call_output")
TEXT_PART_TYPES = ("input_text", "output_text", "text")


class _Model(BaseModel):
    model_config = ConfigDict(extra="ignore")


class TextPart(_Model):
    """A text content part: ``input_text`` (``output_text`` in an earlier answer)."""

    type: Literal["input_text", "output_text", "text"]
    text: StrictText


PartsOrText = StrictText | Annotated[list[TextPart], Field(min_length=1)]


def parts_text(content: PartsOrText) -> str:
    """A string, or text parts joined with newlines."""
    return content if isinstance(content, str) else "\n".join(p.text for p in content)


class MessageItem(_Model):
    """An input message (``type`` may be left out)."""

    type: Literal["message"] = "message"
    role: Literal["user", "system", "developer", "assistant"]
    content: PartsOrText


class FunctionCallItem(_Model):
    """An earlier call of the model (``id`` and ``status`` of an output item ignored)."""

    type: Literal["function_call"]
    call_id: ToolCallId
    name: ToolName
    arguments: StrictText


class FunctionCallOutputItem(_Model):
    """The result of the earlier call ``call_id``."""

    type: Literal["function_call_output"]
    call_id: ToolCallId
    output: PartsOrText


def _message_by_default(value: Any) -> Any:
    """An item with a ``role`` and no ``type`` is a message (OpenAI's easy input)."""
    if isinstance(value, dict) and "type" not in value and "role" in value:
        return {**value, "type": "message"}
    return value


InputItem = Annotated[
    MessageItem | FunctionCallItem | FunctionCallOutputItem,
    Field(discriminator="type"),
    BeforeValidator(_message_by_default),
]


class FunctionTool(_Model):
    """A function tool in the Responses' flat shape."""

    type: Literal["function"]
    name: ToolName
    description: StrictText | None = None
    parameters: dict[str, Any] | None = None
    strict: StrictBool | None = None


class NamedFunctionChoice(_Model):
    """``tool_choice: {"type": "function", "name": ...}``."""

    type: Literal["function"]
    name: StrictText


class TextFormat(_Model):
    """``text.format``: ``text``, ``json_object`` or ``json_schema`` (the schema's
    fields are checked by :mod:`servehall.structured.request`, as for chat)."""

    model_config = ConfigDict(extra="allow")
    type: Literal["text", "json_object", "json_schema"]


class TextConfig(_Model):
    """``text``: its ``format`` (``verbosity`` is accepted and ignored)."""

    format: TextFormat | None = None


MetadataKey = Annotated[str, Field(strict=True, max_length=64)]
MetadataValue = Annotated[str, Field(strict=True, max_length=512)]


class ResponsesRequest(_Model):
    """``POST /v1/responses`` body (see the module docstring)."""

    model: StrictText
    input: StrictText | Annotated[list[InputItem], Field(min_length=1)] | None = None
    instructions: StrictText | None = None
    tools: Annotated[list[FunctionTool], Field(max_length=128)] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedFunctionChoice | None = None
    parallel_tool_calls: StrictBool | None = None
    text: TextConfig | None = None
    max_output_tokens: MaxTokens | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    metadata: Annotated[dict[MetadataKey, MetadataValue], Field(max_length=16)] | None = None
    user: StrictText | None = None
    store: StrictBool = True
    previous_response_id: Annotated[str, Field(strict=True, min_length=1, max_length=64)] | None = (
        None
    )
    stream: StrictBool = False


def _refuse(message: str, param: str) -> UnsupportedParameterError:
    return UnsupportedParameterError(message, param=param)


def check_unsupported_fields(body: dict[str, Any]) -> None:
    """400 ``unsupported_parameter`` naming the first field of ``body`` servehall does not
    implement (see the module docstring); runs before validation, so that a built-in
    tool or an image part is named as such rather than as a shape error.

    Raises:
        UnsupportedParameterError: ``param`` is the field (``tools[2].type``,
            ``input[0].content[1].type`` …).
    """
    reasoning = body.get("reasoning")
    if reasoning is not None and not (
        isinstance(reasoning, dict) and all(v is None for v in reasoning.values())
    ):
        raise _refuse("'reasoning' is not supported: the model does not reason.", "reasoning")
    for name, off in UNSUPPORTED_FIELDS.items():
        if name in body and not asks_for_nothing(body[name], off):
            raise _refuse(f"'{name}' is not supported by this server.", name)
    tools = body.get("tools")
    if isinstance(tools, list):
        for i, tool in enumerate(tools):
            kind = tool.get("type") if isinstance(tool, dict) else None
            if isinstance(kind, str) and kind != "function":
                raise _refuse(
                    f"Tool type '{kind[:64]}' is not supported; only 'function' tools are.",
                    f"tools[{i}].type",
                )
    choice = body.get("tool_choice")
    if isinstance(choice, dict):
        kind = choice.get("type")
        if isinstance(kind, str) and kind != "function":
            raise _refuse(
                f"tool_choice type '{kind[:64]}' is not supported; name a function tool.",
                "tool_choice",
            )
    items = body.get("input")
    if isinstance(items, list):
        for i, item in enumerate(items):
            if not isinstance(item, dict):
                continue
            kind = item.get("type", "message" if "role" in item else None)
            if isinstance(kind, str) and kind not in INPUT_ITEM_TYPES:
                raise _refuse(
                    f"Input items of type '{kind[:64]}' are not supported.", f"input[{i}].type"
                )
            for key in ("content", "output"):
                parts = item.get(key)
                if not isinstance(parts, list):
                    continue
                for j, part in enumerate(parts):
                    ptype = part.get("type") if isinstance(part, dict) else None
                    if isinstance(ptype, str) and ptype not in TEXT_PART_TYPES:
                        raise _refuse(
                            f"Content parts of type '{ptype[:64]}' are not supported; send text.",
                            f"input[{i}].{key}[{j}].type",
                        )


# --- answers (documented shapes; :mod:`servehall.api.responses_translate` builds them) ---


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class ResponseUsage(_Open):
    """``usage`` of a response: ``input_tokens`` (the rendered prompt), ``output_tokens``
    (generated), ``total_tokens``."""

    input_tokens: int
    output_tokens: int
    total_tokens: int


class ResponseObject(_Open):
    """The ``response`` object (``POST /v1/responses``, ``GET /v1/responses/{id}``):
    ``output`` holds ``message`` and ``function_call`` items; the request's settings are
    echoed beside it (OpenAI's field set)."""

    id: str
    object: Literal["response"]
    created_at: int
    status: Literal["completed", "incomplete", "in_progress", "failed"]
    model: str
    output: list[dict[str, Any]]
    usage: ResponseUsage | None = None


class ResponseDeleted(BaseModel):
    """``DELETE /v1/responses/{id}``'s answer."""

    id: str
    object: Literal["response.deleted"]
    deleted: bool
