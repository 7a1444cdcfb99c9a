"""Pydantic models of the OpenAI requests servehall serves (what clients send; what it
answers is :mod:`servehall.api.wire_replies`).

Validation policy (step 1 of the request path):

* numbers are strict: ``max_tokens: "10"``, ``1.5`` or ``true`` are rejected, and so are
  NaN and ±Infinity (the body parser rejects the ``NaN``/``Infinity`` literals too);
* ``temperature`` ∈ [0, 2], ``top_p`` ∈ [0, 1], penalties ∈ [-2, 2], ``max_tokens`` ≥ 1,
  ``n`` ∈ [1, ``server.max_n``] (checked by the route), ``stop`` holds 1–16 non-empty
  strings of at most 256 characters (``[]`` and ``null`` mean no stop list);
* message roles are ``system``, ``developer`` (treated as ``system``), ``user``,
  ``assistant`` and ``tool``; any other role fails validation;
* ``content`` is required for every role but ``assistant`` (one model per role, chosen
  by ``role``, so the OpenAPI document states the same rule); an ``assistant`` message
  may carry ``tool_calls``, a ``tool`` message needs ``tool_call_id``;
* ``tools`` are functions (name 1–64 of ``A-Z a-z 0-9 _ . -``, a JSON Schema
  ``parameters`` object, ``strict``); ``tool_choice`` is ``none``, ``auto``, ``required``
  or a named function; what crosses fields (a known name, a matching ``tool_call_id``, a
  valid schema) is checked by :mod:`servehall.api.tools`;
* integers may be written as integral floats (``10.0``): JSON Schema's ``integer`` allows
  them, so the validator does too;
* ``top_k`` ≥ -1 (-1 and 0 = off), ``min_p`` ∈ [0, 1], ``repetition_penalty`` ∈ [0.01, 10]
  (vLLM/TGI extensions; honoured or refused per engine, see
  :mod:`servehall.api.sampling`);
* unknown fields are ignored, except known OpenAI fields servehall does not implement
  (``logprobs``, ``functions`` …), which get 400 ``unsupported_parameter`` when present
  with anything but null or a value that asks for nothing (``logprobs: 0`` on
  completions is a request for log-probabilities, so it is refused).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

StrictText = Annotated[str, Field(strict=True)]
Temperature = Annotated[float, Field(strict=True, allow_inf_nan=False, ge=0.0, le=2.0)]
TopP = Annotated[float, Field(strict=True, allow_inf_nan=False, ge=0.0, le=1.0)]
Penalty = Annotated[float, Field(strict=True, allow_inf_nan=False, ge=-2.0, le=2.0)]


def _integral(value: Any) -> Any:
    """JSON Schema's ``integer`` includes ``2.0``: an integral float becomes an int; other
    floats, strings and booleans are left for the strict integer check to refuse."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


#: A strict integer (``"10"``, ``true``, ``1.5`` refused; ``10.0`` accepted as 10).
_INTEGRAL = BeforeValidator(_integral)
MaxTokens = Annotated[int, Field(strict=True, ge=1), _INTEGRAL]
Seed = Annotated[int, Field(strict=True, ge=-(2**63), le=2**64 - 1), _INTEGRAL]
N = Annotated[int, Field(strict=True, ge=1, le=128), _INTEGRAL]
Priority = Annotated[int, Field(strict=True, ge=-1000, le=1000), _INTEGRAL]
#: Non-OpenAI sampling extensions (vLLM/TGI names): ``top_k`` -1 or 0 = off;
#: ``min_p`` 0 = off; ``repetition_penalty`` 1 = off.
TopK = Annotated[int, Field(strict=True, ge=-1, le=2**31 - 1), _INTEGRAL]
MinP = Annotated[float, Field(strict=True, allow_inf_nan=False, ge=0.0, le=1.0)]
RepetitionPenalty = Annotated[float, Field(strict=True, allow_inf_nan=False, ge=0.01, le=10.0)]

#: Known OpenAI request fields servehall does not implement. Such a field is "set" when it
#: is present with a value other than null — a falsy value is still a value
#: (``logprobs: 0`` on completions asks for the sampled token's log-probability) — and a
#: set field is refused with 400 ``unsupported_parameter``, unless its value is one of the
#: listed values, which ask for nothing (compared with their JSON type: ``0`` is not
#: ``false``).
UNSUPPORTED_FIELDS: dict[str, tuple[Any, ...]] = {
    "logprobs": (False,),  # chat's boolean off; completions' integer 0 still asks
    "top_logprobs": (),
    "logit_bias": ({},),
    "functions": ([],),
    "function_call": ("none",),
    "best_of": (1,),
    "suffix": ("",),
}


#: Chat-only fields, refused like :data:`UNSUPPORTED_FIELDS` on ``/v1/completions``.
CHAT_ONLY_FIELDS: dict[str, tuple[Any, ...]] = {
    "tools": ([],),
    "tool_choice": ("none",),
    "parallel_tool_calls": (),
}


def asks_for_nothing(value: Any, off_values: tuple[Any, ...]) -> bool:
    """True when ``value`` is null or equals one of ``off_values`` with the same JSON type
    (``0`` is not ``false``, ``1.0`` is not ``1``)."""
    if value is None:
        return True
    return any(type(value) is type(off) and value == off for off in off_values)


class _Model(BaseModel):
    model_config = ConfigDict(extra="ignore")


class StreamOptions(_Model):
    """``stream_options``: ``include_usage`` adds one final usage chunk before ``[DONE]``."""

    include_usage: Annotated[bool, Field(strict=True)] = False


class TextPart(_Model):
    """A content part ``{"type": "text", "text": "..."}``."""

    type: Literal["text"]
    text: StrictText


MessageContent = StrictText | Annotated[list[TextPart], Field(min_length=1)]


class _MessageBase(_Model):
    content: MessageContent | None = None
    name: StrictText | None = None

    def text(self) -> str:
        """The message content as one string (text parts joined with newlines)."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "\n".join(p.text for p in self.content)


class SystemMessage(_MessageBase):
    """A ``system`` (or ``developer``, treated as ``system``) message; ``content`` required."""

    role: Literal["system", "developer"]
    content: MessageContent


class UserMessage(_MessageBase):
    """A ``user`` message; ``content`` required."""

    role: Literal["user"]
    content: MessageContent


ToolName = Annotated[
    str, Field(strict=True, min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.\-]+$")
]
"""A function name: 1–64 characters of ``A-Z a-z 0-9 _ . -`` (OpenAI's rule plus ``.``)."""
ToolCallId = Annotated[str, Field(strict=True, min_length=1, max_length=256)]


class FunctionCall(_Model):
    """``{"name", "arguments"}`` of an earlier call (``arguments`` is JSON text)."""

    name: ToolName
    arguments: StrictText


class AssistantToolCall(_Model):
    """One ``tool_calls[]`` item of an earlier ``assistant`` turn."""

    id: ToolCallId
    type: Literal["function"] = "function"
    function: FunctionCall


class AssistantMessage(_MessageBase):
    """An earlier ``assistant`` turn; ``content`` may be null or absent (with
    ``tool_calls``, the calls it made)."""

    role: Literal["assistant"]
    tool_calls: Annotated[list[AssistantToolCall], Field(max_length=128)] | None = None


class ToolMessage(_MessageBase):
    """A ``tool`` message: the result of the earlier call ``tool_call_id``."""

    role: Literal["tool"]
    content: MessageContent
    tool_call_id: ToolCallId


#: One chat message, chosen by ``role`` (the OpenAPI document states the same rule:
#: ``content`` is required except for ``assistant``).
ChatMessage = Annotated[
    SystemMessage | UserMessage | AssistantMessage | ToolMessage, Field(discriminator="role")
]


class FunctionDefinition(_Model):
    """``tools[].function``: ``parameters`` is a JSON Schema of the arguments object."""

    name: ToolName
    description: StrictText | None = None
    parameters: dict[str, Any] | None = None
    strict: Annotated[bool, Field(strict=True)] | None = None


class ToolDefinition(_Model):
    """One ``tools[]`` entry (type ``function``, the only type)."""

    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(_Model):
    name: StrictText


class NamedToolChoice(_Model):
    """``tool_choice: {"type": "function", "function": {"name": ...}}``."""

    type: Literal["function"]
    function: NamedFunction


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice


StopText = Annotated[str, Field(strict=True, min_length=1, max_length=256)]
StopField = StopText | Annotated[list[StopText], Field(max_length=16)] | None


class _SamplingFields(_Model):
    model: StrictText
    max_tokens: MaxTokens | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    n: N | None = None
    seed: Seed | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    top_k: TopK | None = None
    min_p: MinP | None = None
    repetition_penalty: RepetitionPenalty | None = None
    stop: StopField = None
    stream: Annotated[bool, Field(strict=True)] = False
    stream_options: StreamOptions | None = None
    user: StrictText | None = None
    # scheduling priority (vLLM's extension field; larger runs first here); see
    # servehall.serving.priority for who may raise it
    priority: Priority | None = None
    ignore_eos: Annotated[bool, Field(strict=True)] = False  # vLLM extension (benchmarks)

    def stop_list(self) -> list[str]:
        """``stop`` as a list (empty when absent)."""
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)

    @property
    def include_usage(self) -> bool:
        return bool(self.stream and self.stream_options and self.stream_options.include_usage)


class ChatCompletionRequest(_SamplingFields):
    """``POST /v1/chat/completions`` body."""

    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_completion_tokens: MaxTokens | None = None
    tools: Annotated[list[ToolDefinition], Field(max_length=128)] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: Annotated[bool, Field(strict=True)] | None = None


class CompletionRequest(_SamplingFields):
    """``POST /v1/completions`` body (``prompt`` is one string or a list of one string)."""

    prompt: StrictText | Annotated[list[StrictText], Field(min_length=1, max_length=1)]
    echo: Annotated[bool, Field(strict=True)] = False

    def prompt_text(self) -> str:
        return self.prompt if isinstance(self.prompt, str) else self.prompt[0]


# --- /tokenize and /detokenize (vLLM's extension routes) --------------------------------

StrictBool = Annotated[bool, Field(strict=True)]
TokenId = Annotated[int, Field(strict=True, ge=0, le=2**63 - 1), _INTEGRAL]

#: ``apply_chat_template`` parameters that ``chat_template_kwargs`` may not set (they
#: are the request's own fields, or would change what the call returns or which template
#: runs).
RESERVED_TEMPLATE_KWARGS = frozenset(
    {
        "conversation",
        "messages",
        "tools",
        "documents",
        "chat_template",
        "add_generation_prompt",
        "continue_final_message",
        "tokenize",
        "padding",
        "truncation",
        "max_length",
        "return_tensors",
        "return_dict",
        "return_assistant_tokens_mask",
        "tokenizer_kwargs",
        "processor_kwargs",
    }
)


#: What a ``chat_template_kwargs`` key must match (an ASCII identifier).
TEMPLATE_KWARG_NAME = r"^[A-Za-z_][A-Za-z0-9_]*$"

TemplateKwargs = Annotated[
    dict[str, Any],
    Field(
        json_schema_extra={
            "propertyNames": {
                "pattern": TEMPLATE_KWARG_NAME,
                "not": {"enum": sorted(RESERVED_TEMPLATE_KWARGS)},
            }
        }
    ),
]
"""``chat_template_kwargs``: its keys are checked by the route (the schema states it)."""


class TokenizeCompletionRequest(_Model):
    """``POST /tokenize`` with a ``prompt``: its ids as ``/v1/completions`` feeds them to
    the model (``add_special_tokens`` adds what the tokenizer adds, e.g. BOS; default
    true). ``model`` may be left out: the first served model the caller may use.
    ``messages`` makes it a :class:`TokenizeChatRequest` (both is refused)."""

    model_config = ConfigDict(extra="ignore", json_schema_extra={"not": {"required": ["messages"]}})

    model: StrictText | None = None
    prompt: StrictText
    add_special_tokens: StrictBool = True
    return_token_strs: StrictBool | None = False


class TokenizeChatRequest(_Model):
    """``POST /tokenize`` with ``messages``: the ids of the rendered chat template, as
    ``/v1/chat/completions`` builds them for the same ``messages``, ``tools`` and
    ``tool_choice`` (tools are rendered unless ``tool_choice`` is ``none``).

    ``add_generation_prompt`` (default true, false with ``continue_final_message``) ends
    with the assistant header; ``continue_final_message`` ends inside the last message
    instead (both true is refused); ``add_special_tokens`` (default false) adds the
    tokenizer's own special tokens on top of the template's; ``chat_template_kwargs`` are
    extra template variables (not the names in :data:`RESERVED_TEMPLATE_KWARGS`). The
    rules across fields are the route's (:mod:`servehall.api.tokenize`); the schema
    states them too (no ``prompt``; not both true)."""

    model_config = ConfigDict(
        extra="ignore",
        json_schema_extra={
            "allOf": [
                {"not": {"required": ["prompt"]}},
                {
                    "not": {
                        "required": ["add_generation_prompt", "continue_final_message"],
                        "properties": {
                            "add_generation_prompt": {"const": True},
                            "continue_final_message": {"const": True},
                        },
                    }
                },
            ]
        },
    )

    model: StrictText | None = None
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    add_generation_prompt: StrictBool | None = None
    continue_final_message: StrictBool = False
    add_special_tokens: StrictBool = False
    return_token_strs: StrictBool | None = False
    chat_template_kwargs: TemplateKwargs | None = None
    tools: Annotated[list[ToolDefinition], Field(max_length=128)] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: StrictBool | None = None

    @property
    def generation_prompt(self) -> bool:
        """Whether the rendering ends with the assistant header."""
        if self.add_generation_prompt is None:
            return not self.continue_final_message
        return self.add_generation_prompt


#: A chat request whose messages and tools render a prompt (the chat template's input).
ChatPromptRequest = ChatCompletionRequest | TokenizeChatRequest


class DetokenizeRequest(_Model):
    """``POST /detokenize``: ``tokens`` (ids of the model's vocabulary) to text."""

    model: StrictText | None = None
    tokens: list[TokenId]


MAX_EMBEDDING_INPUTS = 2048
"""Most inputs one ``/v1/embeddings`` request may carry (OpenAI's limit)."""


class EmbeddingRequest(_Model):
    """``POST /v1/embeddings`` (OpenAI's shape).

    ``input`` is a string, a list of strings, a list of token ids (one input) or a list
    of token-id lists; 1 to :data:`MAX_EMBEDDING_INPUTS` inputs, none empty (the route
    checks the counts, the vocabulary and the model's input length).
    ``encoding_format`` ``float`` (default) answers lists of numbers, ``base64`` the
    little-endian float32 bytes of each vector, base64-encoded. ``dimensions`` asks for
    a shorter vector: only a model that declares Matryoshka representations allows it
    (else 400 naming ``dimensions``). ``user`` is accepted and, as on chat, picks the
    sticky version."""

    model: StrictText
    input: (
        StrictText
        | list[StrictText]
        | list[TokenId]
        | list[Annotated[list[TokenId], Field(min_length=1)]]
    )
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: Annotated[int, Field(strict=True, ge=1), _INTEGRAL] | None = None
    user: StrictText | None = None
