"""``POST /v1/embeddings`` (OpenAI's embeddings API) for ``[[models]] task = "embed"``.

The request path is chat's (:mod:`servehall.api.inference`), without generation:
parse and validate (:class:`~servehall.api.wire.EmbeddingRequest`) → model access (404)
and version choice (``user`` and the version pin as on chat) → the model's task (a
``generate`` model is a 400 naming ``model``, code ``wrong_model_task``) →
``dimensions`` (:func:`check_dimensions`) → every input as token ids
(:func:`input_token_ids`: strings through the completion path's tokenizer with the
model's special tokens, token arrays checked against the vocabulary; an input longer than
the model's ``max_model_len`` is a 400 ``context_length_exceeded`` naming the limit) →
input filters (token inputs are decoded for them) → authorize (quota reservations; token
rate limits count the input tokens) → record-bus admission and a scheduler slot → one
``embed`` call on the engine (:class:`~servehall.engines.contract.EmbeddingEngine`,
batched there with other requests) → the response (:func:`encode_vector`) → one
``request_log`` row (``prompt_tokens`` = input tokens, ``completion_tokens`` 0) and the
request metrics.
"""

from __future__ import annotations

import base64
import logging
import struct
import uuid
from collections.abc import Sequence
from typing import Any

from pydantic import ValidationError
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse
from starlette.types import Receive, Scope, Send

from servehall.admission.usage import AdmissionRequest
from servehall.api.body import check_media_type, parse_json_object, read_body
from servehall.api.errors import from_validation_error
from servehall.api.intake import (
    STATUS_CLIENT_CLOSED,
    end_request,
    end_with_error,
    open_state,
)
from servehall.api.offload import encode_plain
from servehall.api.prepare import admit_request, filter_inputs, serve_model
from servehall.api.state import ApiState
from servehall.api.wire import MAX_EMBEDDING_INPUTS, EmbeddingRequest
from servehall.api.wire_replies import EmbeddingData, EmbeddingResponse, EmbeddingUsage
from servehall.engines.contract import EmbeddingEngine
from servehall.engines.pooling import truncate
from servehall.errors import ContextLengthExceededError, InvalidRequestError
from servehall.plugin.host import ServedModel
from servehall.serving.priority import request_priority
from servehall.serving.request import RequestState
from servehall.text.budget import check_prompt_chars

log = logging.getLogger("servehall.api")

ENDPOINT = "/v1/embeddings"


def model_task(served: ServedModel) -> str:
    """``"embed"`` or ``"generate"``: what ``served`` is configured for."""
    return served.config.task if served.config is not None else "generate"


def check_dimensions(requested: int | None, extra: dict[str, Any]) -> int | None:
    """The length to truncate each vector to, or None for the model's own.

    ``extra`` is the engine's ``model_info.extra`` (``embedding_dim``, ``matryoshka``,
    ``matryoshka_dimensions``). ``requested`` equal to the model's dimension is allowed
    on every model (nothing to do).

    Raises:
        InvalidRequestError: 400 naming ``dimensions``: the model does not declare
            Matryoshka representations, or the value is above the model's dimension or
            not one it was trained for.
    """
    if requested is None:
        return None
    dim = int(extra.get("embedding_dim") or 0)
    if requested == dim:
        return None
    if not extra.get("matryoshka"):
        raise InvalidRequestError(
            f"This model does not support 'dimensions' (its embeddings have {dim} "
            "dimensions and it declares no Matryoshka representations to shorten them).",
            param="dimensions",
        )
    allowed = [int(d) for d in extra.get("matryoshka_dimensions") or ()]
    if requested > dim or (allowed and requested not in allowed):
        choices = allowed or f"1 to {dim}"
        raise InvalidRequestError(
            f"'dimensions' must be one of {choices} for this model, not {requested}.",
            param="dimensions",
        )
    return requested


def as_inputs(value: str | list[Any]) -> tuple[list[str] | None, list[list[int]] | None]:
    """``input`` as ``(texts, None)`` or ``(None, token lists)``.

    Raises:
        InvalidRequestError: 400 naming ``input``: no input, more than
            :data:`~servehall.api.wire.MAX_EMBEDDING_INPUTS`, or an empty string.
    """
    if isinstance(value, str):
        items: list[Any] = [value]
    elif value and isinstance(value[0], int):
        items = [value]  # one token array
    else:
        items = value
    if not items:
        raise InvalidRequestError("'input' must hold at least one input.", param="input")
    if len(items) > MAX_EMBEDDING_INPUTS:
        raise InvalidRequestError(
            f"'input' may hold at most {MAX_EMBEDDING_INPUTS} inputs, not {len(items)}.",
            param="input",
        )
    if isinstance(items[0], str):
        for i, text in enumerate(items):
            if not text:
                raise InvalidRequestError(
                    "An input string is empty.", param="input" if len(items) == 1 else f"input[{i}]"
                )
        return list(items), None
    return None, [list(x) for x in items]


def check_length(ids: Sequence[int], limit: int, param: str) -> None:
    """Raise 400 ``context_length_exceeded`` naming ``limit`` when ``ids`` is longer.

    Raises:
        ContextLengthExceededError: more than ``limit`` tokens.
    """
    if len(ids) > limit:
        raise ContextLengthExceededError(
            f"This model's maximum input length is {limit} tokens. However, {param} has "
            f"{len(ids)} tokens. Please shorten it.",
            param=param,
        )


def encode_vector(vector: Sequence[float], encoding: str) -> list[float] | str:
    """``vector`` as ``encoding_format`` asks: the floats as they are (``float``), or
    (``base64``) the little-endian float32 bytes base64-encoded, as OpenAI sends them
    (the SDK decodes them with ``numpy.frombuffer(..., dtype="float32")``)."""
    if encoding == "float":
        return list(vector)
    raw = struct.pack(f"<{len(vector)}f", *vector)
    return base64.b64encode(raw).decode("ascii")


def _param(index: int, count: int) -> str:
    return "input" if count == 1 else f"input[{index}]"


async def input_token_ids(
    served: ServedModel, texts: list[str] | None, tokens: list[list[int]] | None
) -> list[list[int]]:
    """Every input as the ids the model embeds (see the module docstring).

    Raises:
        InvalidRequestError: an id outside the vocabulary (code ``invalid_token_id``,
            ``param`` ``input[i][j]`` or ``input[j]``).
        ContextLengthExceededError: an input longer than ``served.max_model_len``.
    """
    tok = served.tokenizer
    limit = served.max_model_len
    if tokens is not None:
        for i, ids in enumerate(tokens):
            bad = tok.first_unknown_id(ids)
            if bad is not None:
                where = f"input[{bad}]" if len(tokens) == 1 else f"input[{i}][{bad}]"
                raise InvalidRequestError(
                    f"Token id {ids[bad]} is not in the model's vocabulary "
                    f"(ids 0 to {tok.vocab_size - 1}).",
                    param=where,
                    code="invalid_token_id",
                )
            check_length(ids, limit, _param(i, len(tokens)))
        return tokens
    assert texts is not None
    out: list[list[int]] = []
    for i, text in enumerate(texts):
        param = _param(i, len(texts))
        check_prompt_chars(len(text), getattr(tok, "max_token_chars", None), limit + 1, param)
        ids = await encode_plain(tok, text)
        if not ids:
            raise InvalidRequestError("An input has no tokens.", param=param)
        check_length(ids, limit, param)
        out.append(ids)
    return out


class EmbeddingsEndpoint:
    """ASGI endpoint of ``POST /v1/embeddings`` (see the module docstring)."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        api: ApiState = scope["app"].state.api
        request = Request(scope, receive)
        rid = "embd-" + uuid.uuid4().hex
        state = open_state(api, scope, rid, ENDPOINT)
        body_read = False
        try:
            try:
                check_media_type(request)
                raw = await read_body(request, api.host.settings.server.max_body_bytes)
                body_read = True
            except ClientDisconnect:
                state.finish(STATUS_CLIENT_CLOSED, finish_reason="client_disconnect")
                return
            body = parse_json_object(raw)
            raw = b""
            payload, headers = await self._handle(api, state, body)
            await state.record_before_last_byte()
            state.response_started = True
            await JSONResponse(payload, headers=headers)(scope, receive, send)
            state.finish(200, prompt_text=state.prompt_text)
        except Exception as exc:
            await end_with_error(state, exc, scope, receive, send, body_read=body_read)
        finally:
            end_request(state)

    async def _handle(
        self, api: ApiState, state: RequestState, body: dict[str, Any]
    ) -> tuple[dict[str, Any], dict[str, str]]:
        try:
            req = EmbeddingRequest.model_validate(body)
        except ValidationError as exc:
            raise from_validation_error(exc) from None
        name = req.model
        served = await serve_model(api, state, name, req.user)
        engine = served.engine
        if model_task(served) != "embed" or not isinstance(engine, EmbeddingEngine):
            raise InvalidRequestError(
                f"The model '{name}' is served for text generation, not embeddings "
                "(use /v1/chat/completions or /v1/completions).",
                param="model",
                code="wrong_model_task",
            )
        dimensions = check_dimensions(req.dimensions, engine.model_info.extra)
        texts, tokens = as_inputs(req.input)
        inputs = await input_token_ids(served, texts, tokens)
        if texts is None and api.host.input_filters:
            texts = [served.tokenizer.decode(ids) for ids in inputs]
        if texts is not None:
            filter_inputs(api, state, texts, ENDPOINT, name, "input")
        state.prompt_text = "\n".join(texts) if texts is not None else ""
        total = sum(len(ids) for ids in inputs)
        state.prompt_tokens = total

        admission = AdmissionRequest(
            request_id=state.request_id,
            endpoint=ENDPOINT,
            model=name,
            principal=state.principal,
            prompt_tokens=total,
            max_tokens=0,
        )
        priority = request_priority(state.principal, None)
        admitted = await admit_request(api, state, served, admission, priority)
        try:
            vectors = await engine.embed(inputs)
        finally:
            await admitted.done(total, 0)
        api.readiness.mark_ok(served.key)
        normalize = bool(engine.model_info.extra.get("normalize", True))
        data = [
            EmbeddingData(
                index=i,
                embedding=encode_vector(
                    v if dimensions is None else truncate(v, dimensions, normalize=normalize),
                    req.encoding_format,
                ),
            )
            for i, v in enumerate(vectors)
        ]
        out = EmbeddingResponse(
            data=data, model=name, usage=EmbeddingUsage(prompt_tokens=total, total_tokens=total)
        )
        return out.model_dump(), admitted.headers
