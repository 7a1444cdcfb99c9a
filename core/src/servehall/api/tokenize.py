"""``POST /tokenize`` and ``POST /detokenize``: vLLM's tokenizer routes, same shapes.

``/tokenize`` takes a ``prompt`` (:class:`~servehall.api.wire.TokenizeCompletionRequest`)
or ``messages`` (:class:`~servehall.api.wire.TokenizeChatRequest`) and answers
``{"count", "max_model_len", "tokens", "token_strs"}``: the ids the inference routes
feed the model for the same input — a prompt through the completion path
(:meth:`~servehall.text.tokenizer.TextTokenizer.encode_plain`: text that looks like a
special token stays plain text), messages through the chat template
(:meth:`~servehall.text.tokenizer.TextTokenizer.render_chat`, with the request's
``tools`` unless ``tool_choice`` is ``none``, checked as chat checks them).
``/detokenize`` takes ``tokens`` and answers ``{"prompt"}``, special tokens written out
(vLLM's ``tokenizer.decode``).

Guarded like the inference routes: authentication (the middleware), the ``inference``
scope and the model allow-list (:func:`~servehall.admission.access.check_model_access`:
404 ``model_not_found`` for an unknown or hidden model), the version choice and
``x-servehall-version`` pin of chat. ``model`` may be left out (as in vLLM): the first
served model the caller may use. Bad input is a 400 envelope naming the field: wrong
types, both or neither of ``prompt``/``messages``, ``continue_final_message`` with
``add_generation_prompt``, a reserved ``chat_template_kwargs`` key, a token id outside
the vocabulary (``param`` ``tokens[i]``, code ``invalid_token_id``).

Not recorded: these requests generate nothing, so they write no ``request_log`` row
and carry no ``x-request-id`` (vLLM logs them only at debug level); they take no
scheduler slot, no quota reservation and no input filter. A refused credential is still
recorded by the auth middleware, as on every route.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from typing import Any

from pydantic import ValidationError
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.types import Receive, Scope, Send

from servehall.admission.access import check_model_access
from servehall.admission.principal import ANONYMOUS, Principal
from servehall.api.body import check_media_type, drain_body, parse_json_object, read_body
from servehall.api.errors import error_response, from_validation_error
from servehall.api.offload import LONG_TEXT, run_heavy
from servehall.api.prompt import chat_turns, prompt_texts
from servehall.api.state import ApiState
from servehall.api.tools import tool_plan
from servehall.api.wire import (
    RESERVED_TEMPLATE_KWARGS,
    TEMPLATE_KWARG_NAME,
    DetokenizeRequest,
    TokenizeChatRequest,
    TokenizeCompletionRequest,
)
from servehall.api.wire_replies import DetokenizeResponse, TokenizeResponse
from servehall.errors import (
    InvalidRequestError,
    NotFoundError,
    PayloadTooLargeError,
    ServehallError,
)
from servehall.plugin.host import ServedModel
from servehall.rollout.choose import choose_version
from servehall.rollout.router import VERSION_HEADER

_KWARG_NAME = re.compile(TEMPLATE_KWARG_NAME)

Handler = Callable[[ApiState, Principal, str | None, dict[str, Any]], Awaitable[Response]]


class TokenizerEndpoint:
    """ASGI endpoint for one of the two routes: reads the JSON body as the inference
    routes do (media type, size limit, parse), answers the handler's response or the
    error envelope, and drains a body it did not read (413, 415)."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        api: ApiState = scope["app"].state.api
        request = Request(scope, receive)
        principal: Principal = scope.get("state", {}).get("principal") or ANONYMOUS
        body_read = False
        try:
            check_media_type(request)
            raw = await read_body(request, api.host.settings.server.max_body_bytes)
            body_read = True
            body = parse_json_object(raw)
            response = await self.handler(api, principal, request.headers.get(VERSION_HEADER), body)
        except ClientDisconnect:
            return
        except ServehallError as exc:
            close = isinstance(exc, PayloadTooLargeError) and scope.get("http_version") in (
                "1.0",
                "1.1",
            )
            response = error_response(exc, close=close)
        await response(scope, receive, send)
        if not body_read:
            await drain_body(receive)


def _validate(model: Any, body: dict[str, Any]) -> Any:
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        raise from_validation_error(exc) from None


def _served(
    api: ApiState, principal: Principal, name: str | None, pinned: str | None
) -> ServedModel:
    """The version that answers (see the module docstring for ``model`` left out).

    Raises:
        PermissionDeniedError / NotFoundError: as for chat (no scope, unknown or hidden
            model; 404 ``model_not_found`` also when no served model is open to the caller).
        InvalidRequestError: a version pin naming no version.
    """
    if name is None:
        policy = principal.policy
        name = next((n for n in api.host.served_names() if policy.may_use(n)), None)
        if name is None:
            raise NotFoundError(
                "No served model is open to this caller; name one in 'model'.",
                param="model",
                code="model_not_found",
            )
    check_model_access(principal, name, served=bool(api.router.versions(name)))
    served = choose_version(api, name, principal, None, pinned)
    assert served is not None
    return served


def _headers(served: ServedModel) -> dict[str, str] | None:
    return {VERSION_HEADER: served.version} if served.version else None


def _check_chat_fields(req: TokenizeChatRequest) -> None:
    """The rules across fields of a chat tokenize request (400 naming the field)."""
    if req.continue_final_message and req.add_generation_prompt:
        raise InvalidRequestError(
            "continue_final_message and add_generation_prompt cannot both be true.",
            param="continue_final_message",
        )
    for key in req.chat_template_kwargs or {}:
        if key in RESERVED_TEMPLATE_KWARGS or not _KWARG_NAME.match(key):
            raise InvalidRequestError(
                f"chat_template_kwargs may not set {key[:64]!r} (reserved, or not an identifier).",
                param="chat_template_kwargs",
            )


async def _chat_ids(served: ServedModel, req: TokenizeChatRequest) -> list[int]:
    """The prompt ids chat builds for these messages and tools."""
    _check_chat_fields(req)
    plan = tool_plan(req)
    texts, owners = prompt_texts(req)
    turns = chat_turns(req, texts, owners)
    tools = [t.template() for t in plan.tools] if plan.active else None
    tok = served.tokenizer
    kwargs: dict[str, Any] = {
        "template_kwargs": req.chat_template_kwargs,
        "add_generation_prompt": req.generation_prompt,
        "continue_final_message": req.continue_final_message,
    }
    if sum(len(t) for t in texts) > LONG_TEXT:
        ids: list[int] = await run_heavy(tok.render_chat, turns, tools, **kwargs)
    else:
        ids = tok.render_chat(turns, tools, **kwargs)
    if req.add_special_tokens:
        ids = tok.with_special_tokens(ids)
    return ids


async def tokenize(
    api: ApiState, principal: Principal, pinned: str | None, body: dict[str, Any]
) -> Response:
    """``POST /tokenize`` (see the module docstring)."""
    has_messages, has_prompt = "messages" in body, "prompt" in body
    if has_messages and has_prompt:
        raise InvalidRequestError("Give either 'prompt' or 'messages', not both.", param="prompt")
    if not has_messages and not has_prompt:
        raise InvalidRequestError(
            "Give 'prompt' (a string) or 'messages' (a chat) to tokenize.", param="prompt"
        )
    req: TokenizeChatRequest | TokenizeCompletionRequest = _validate(
        TokenizeChatRequest if has_messages else TokenizeCompletionRequest, body
    )
    served = _served(api, principal, req.model, pinned)
    tok = served.tokenizer
    if isinstance(req, TokenizeChatRequest):
        ids = await _chat_ids(served, req)
    elif len(req.prompt) > LONG_TEXT:
        ids = await run_heavy(
            tok.encode_plain, req.prompt, add_special_tokens=req.add_special_tokens
        )
    else:
        ids = tok.encode_plain(req.prompt, add_special_tokens=req.add_special_tokens)
    out = TokenizeResponse(
        count=len(ids),
        max_model_len=served.max_model_len,
        tokens=ids,
        token_strs=tok.token_strings(ids) if req.return_token_strs else None,
    )
    return JSONResponse(out.model_dump(), headers=_headers(served))


async def detokenize(
    api: ApiState, principal: Principal, pinned: str | None, body: dict[str, Any]
) -> Response:
    """``POST /detokenize`` (see the module docstring)."""
    req: DetokenizeRequest = _validate(DetokenizeRequest, body)
    served = _served(api, principal, req.model, pinned)
    tok = served.tokenizer
    bad = tok.first_unknown_id(req.tokens)
    if bad is not None:
        raise InvalidRequestError(
            f"Token id {req.tokens[bad]} is not in the model's vocabulary "
            f"(ids 0 to {tok.vocab_size - 1}).",
            param=f"tokens[{bad}]",
            code="invalid_token_id",
        )
    if len(req.tokens) > LONG_TEXT:
        text = await run_heavy(tok.decode, req.tokens, skip_special_tokens=False)
    else:
        text = tok.decode(req.tokens, skip_special_tokens=False)
    return JSONResponse(DetokenizeResponse(prompt=text).model_dump(), headers=_headers(served))
