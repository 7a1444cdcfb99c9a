"""Pydantic models of what servehall answers on the OpenAI surface (the parts it serves):
chat completions and their streamed chunks, completions, the model list, the error
envelope, and the answers of ``/tokenize``, ``/detokenize`` and ``/v1/embeddings``.

The endpoints write their JSON directly; these models state its shape — the OpenAPI
document (:mod:`servehall.api.openapi`) is built from them, and ``/v1/models`` and
``/v1/embeddings`` fill them. What clients send is :mod:`servehall.api.wire`.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel

# --- /tokenize, /detokenize and /v1/embeddings ------------------------------------------


class TokenizeResponse(BaseModel):
    """``/tokenize``'s answer: the ids, their count, the model's context length and
    (``return_token_strs``) each id's token as the vocabulary spells it."""

    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: list[str] | None = None


class DetokenizeResponse(BaseModel):
    """``/detokenize``'s answer: the text of the ids, special tokens written out."""

    prompt: str


class EmbeddingData(BaseModel):
    """One input's vector: a list of floats, or base64 (``encoding_format``)."""

    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | str


class EmbeddingUsage(BaseModel):
    """Input tokens of the request (embeddings generate none)."""

    prompt_tokens: int
    total_tokens: int


class EmbeddingResponse(BaseModel):
    """``/v1/embeddings``' answer, one ``data`` entry per input, in input order."""

    object: Literal["list"] = "list"
    data: list[EmbeddingData]
    model: str
    usage: EmbeddingUsage


# --- chat and completions --------------------------------------------------------------


class Usage(BaseModel):
    """Token counts of one request (all choices)."""

    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class ResponseFunction(BaseModel):
    name: str
    arguments: str


class ResponseToolCall(BaseModel):
    """A call the model made: ``arguments`` is JSON text as the model wrote it."""

    id: str
    type: Literal["function"] = "function"
    function: ResponseFunction


class ChatResponseMessage(BaseModel):
    """The answer: ``content`` is null when the model only called tools."""

    role: Literal["assistant"] = "assistant"
    content: str | None
    tool_calls: list[ResponseToolCall] | None = None


class ChatChoice(BaseModel):
    index: int
    message: ChatResponseMessage
    logprobs: None = None
    finish_reason: str | None


class _ResponseHead(BaseModel):
    """The fields every completion response and chunk opens with (each subclass narrows
    ``object`` to its literal; the field keeps its place)."""

    id: str
    object: str
    created: int
    model: str


class ChatCompletion(_ResponseHead):
    """Non-streamed ``chat.completion`` response."""

    object: Literal["chat.completion"] = "chat.completion"
    choices: list[ChatChoice]
    usage: Usage


class DeltaFunction(BaseModel):
    name: str | None = None
    arguments: str


class DeltaToolCall(BaseModel):
    """A piece of call ``index``: its first piece has ``id``, ``type`` and
    ``function.name``; later ones only ``function.arguments`` fragments."""

    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: DeltaFunction


class ChatDelta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None
    tool_calls: list[DeltaToolCall] | None = None


class ChatChunkChoice(BaseModel):
    index: int
    delta: ChatDelta
    logprobs: None = None
    finish_reason: str | None = None


class ChatCompletionChunk(_ResponseHead):
    """One ``chat.completion.chunk`` SSE event (``usage`` only on the final usage chunk)."""

    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    choices: list[ChatChunkChoice]
    usage: Usage | None = None


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: None = None
    finish_reason: str | None


class Completion(_ResponseHead):
    """``text_completion`` response, also the shape of each streamed chunk."""

    object: Literal["text_completion"] = "text_completion"
    choices: list[CompletionChoice]
    usage: Usage | None = None


class ModelCard(BaseModel):
    """One model (``GET /v1/models/{model}``; the items of :class:`ModelList`)."""

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
