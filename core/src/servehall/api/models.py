"""Pydantic models of the OpenAI request and response schema (the parts servehall serves).

Validation policy (step 1 of the request path):

* numbers are strict: ``max_tokens: "10"``, ``1.5`` or ``true`` are rejected, and so are
  NaN and ±Infinity (the body parser rejects the ``NaN``/``Infinity`` literals too);
* ``temperature`` ∈ [0, 2], ``top_p`` ∈ [0, 1], penalties ∈ [-2, 2], ``max_tokens`` ≥ 1,
  ``n`` ∈ [1, ``server.max_n``] (checked by the route), ``stop`` holds 1–16 non-empty
  strings of at most 256 characters (``[]`` and ``null`` mean no stop list);
* message roles are ``system``, ``developer`` (treated as ``system``), ``user`` and
  ``assistant``; any other role fails validation;
* unknown fields are ignored, except known OpenAI fields servehall does not implement
  (``logprobs``, ``tools`` …), which get 400 ``unsupported_parameter`` when set.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

StrictText = Annotated[str, Field(strict=True)]
Temperature = Annotated[float, Field(strict=True, allow_inf_nan=False, ge=0.0, le=2.0)]
TopP = Annotated[float, Field(strict=True, allow_inf_nan=False, ge=0.0, le=1.0)]
Penalty = Annotated[float, Field(strict=True, allow_inf_nan=False, ge=-2.0, le=2.0)]
MaxTokens = Annotated[int, Field(strict=True, ge=1)]
Seed = Annotated[int, Field(strict=True, ge=-(2**63), le=2**64 - 1)]
N = Annotated[int, Field(strict=True, ge=1, le=128)]

#: Known OpenAI request fields servehall does not implement: 400 when set to a value other
#: than these "off" values.
UNSUPPORTED_FIELDS: dict[str, tuple[Any, ...]] = {
    "logprobs": (None, False, 0),
    "top_logprobs": (None, 0),
    "logit_bias": (None, {}),
    "tools": (None, []),
    "tool_choice": (None, "none"),
    "functions": (None, []),
    "function_call": (None, "none"),
    "best_of": (None, 1),
    "suffix": (None, ""),
    "response_format": (None, {"type": "text"}),
}


class _Model(BaseModel):
    model_config = ConfigDict(extra="ignore")


class StreamOptions(_Model):
    """``stream_options``: ``include_usage`` adds one final usage chunk before ``[DONE]``."""

    include_usage: Annotated[bool, Field(strict=True)] = False


class TextPart(_Model):
    """A content part ``{"type": "text", "text": "..."}``."""

    type: Literal["text"]
    text: StrictText


class ChatMessage(_Model):
    """One chat message. ``content`` is text, a list of text parts, or (assistant) null."""

    role: Literal["system", "developer", "user", "assistant"]
    content: StrictText | Annotated[list[TextPart], Field(min_length=1)] | None = None
    name: StrictText | None = None

    def text(self) -> str:
        """The message content as one string (text parts joined with newlines)."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "\n".join(p.text for p in self.content)


StopText = Annotated[str, Field(strict=True, max_length=256)]
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
    stop: StopField = None
    stream: Annotated[bool, Field(strict=True)] = False
    stream_options: StreamOptions | None = None
    user: StrictText | None = None

    @field_validator("stop")
    @classmethod
    def _non_empty_stops(cls, v: str | list[str] | None) -> str | list[str] | None:
        items = [v] if isinstance(v, str) else (v or [])
        if any(s == "" for s in items):
            raise ValueError("stop strings must be non-empty")
        return v

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

    @field_validator("messages")
    @classmethod
    def _user_content(cls, v: list[ChatMessage]) -> list[ChatMessage]:
        for i, m in enumerate(v):
            if m.role != "assistant" and m.content is None:
                raise ValueError(f"messages[{i}].content is required for role {m.role!r}")
        return v


class CompletionRequest(_SamplingFields):
    """``POST /v1/completions`` body (``prompt`` is one string or a list of one string)."""

    prompt: StrictText | Annotated[list[StrictText], Field(min_length=1, max_length=1)]
    echo: Annotated[bool, Field(strict=True)] = False

    def prompt_text(self) -> str:
        return self.prompt if isinstance(self.prompt, str) else self.prompt[0]


# --- responses -------------------------------------------------------------------------


class Usage(BaseModel):
    """Token counts of one request (all choices)."""

    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class ChatResponseMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class ChatChoice(BaseModel):
    index: int
    message: ChatResponseMessage
    logprobs: None = None
    finish_reason: str | None


class ChatCompletion(BaseModel):
    """Non-streamed ``chat.completion`` response."""

    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage


class ChatDelta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None


class ChatChunkChoice(BaseModel):
    index: int
    delta: ChatDelta
    logprobs: None = None
    finish_reason: str | None = None


class ChatCompletionChunk(BaseModel):
    """One ``chat.completion.chunk`` SSE event (``usage`` only on the final usage chunk)."""

    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: None = None
    finish_reason: str | None


class Completion(BaseModel):
    """``text_completion`` response, also the shape of each streamed chunk."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "servehall"
    max_model_len: int | None = None


class ModelList(BaseModel):
    """``GET /v1/models``: the models the caller may use."""

    object: Literal["list"] = "list"
    data: list[ModelCard]


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    """The OpenAI error envelope."""

    error: ErrorDetail
