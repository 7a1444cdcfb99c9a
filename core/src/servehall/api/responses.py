"""``/v1/responses``: OpenAI's Responses API on the chat-completions request path.

* ``POST /v1/responses`` — :class:`ResponsesEndpoint`: the body is checked
  (:mod:`servehall.api.responses_wire`), turned into a chat request
  (:mod:`servehall.api.responses_translate`) and run by
  :class:`~servehall.api.inference.InferenceEndpoint`'s chat path — the same model
  access, filters, tools, structured output, admission, rate limits, one
  ``request_log`` row (endpoint ``/v1/responses``) and metrics; only the answer differs:
  a ``response`` object, or the Responses SSE events with ``stream: true``. Errors name
  the Responses fields. With ``store: true`` (the default) the response and the
  conversation up to it are stored (:mod:`servehall.responses.store`) before its last
  byte leaves (a database that cannot be reached or is not migrated is a 503
  ``responses_unavailable`` before anything is generated); ``previous_response_id``
  continues a stored one (404 ``previous_response_not_found`` when the caller has none
  of that id);
* ``GET /v1/responses/{id}`` — the stored response object;
* ``DELETE /v1/responses/{id}`` — ``{id, object: "response.deleted", deleted: true}``.

A stored response is visible only to the principal that made it (another principal's id
is a 404 ``response_not_found``, as an unknown one). Every route needs the ``inference``
scope (403 ``insufficient_scope``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import Send

from servehall.admission.principal import ANONYMOUS, SCOPE_INFERENCE, Principal
from servehall.api.errors import from_validation_error
from servehall.api.inference import InferenceEndpoint
from servehall.api.response import dumps, response_headers, run_choices
from servehall.api.responses_translate import (
    EventWriter,
    chat_body,
    input_items,
    output_as_input,
    output_items,
    public_message,
    public_param,
    response_object,
    sse,
    status_of,
    usage_object,
)
from servehall.api.responses_wire import ResponsesRequest, check_unsupported_fields
from servehall.api.sse import first_then_rest, merged_events
from servehall.api.state import ApiState
from servehall.api.wire import ChatCompletionRequest, CompletionRequest
from servehall.errors import (
    InvalidRequestError,
    NotFoundError,
    PermissionDeniedError,
    ServehallError,
)
from servehall.responses.store import ResponseStore
from servehall.serving.choice import ChoiceEvent
from servehall.serving.request import RequestState

log = logging.getLogger("servehall.api")


@dataclass(slots=True)
class _Turn:
    """What one ``/v1/responses`` request keeps between its steps."""

    req: ResponsesRequest
    items: list[dict[str, Any]]  # the conversation up to this response (stored with it)
    store: ResponseStore | None  # None: not stored


class ResponsesEndpoint(InferenceEndpoint):
    """ASGI endpoint of ``POST /v1/responses`` (see the module docstring)."""

    def __init__(self) -> None:
        super().__init__("chat")
        self.endpoint = "/v1/responses"
        self.prefix = "resp_"

    async def _prepare(
        self, api: ApiState, state: RequestState, body: dict[str, Any]
    ) -> dict[str, Any]:
        check_unsupported_fields(body)
        try:
            req = ResponsesRequest.model_validate(body)
        except ValidationError as exc:
            raise from_validation_error(exc) from None
        history: list[dict[str, Any]] = []
        if req.previous_response_id is not None:
            stored = await api.responses.get(req.previous_response_id, state.principal.id)
            if stored is None:
                raise NotFoundError(
                    f"Previous response with id '{req.previous_response_id}' not found.",
                    param="previous_response_id",
                    code="previous_response_not_found",
                )
            history = [*stored.input_items, *output_as_input(stored.body.get("output", []))]
        elif req.input is None:
            raise InvalidRequestError("'input' is required.", param="input")
        store = api.responses if req.store and api.responses.enabled else None
        if req.store and store is None:
            req = req.model_copy(update={"store": False})
        elif store is not None:
            await store.engine()  # 503 now, before generating, when it cannot store
        state.route_data = _Turn(req, [*history, *input_items(req)], store)
        return chat_body(req, history)

    def _public_error(self, exc: ServehallError) -> ServehallError:
        exc.param = public_param(exc.param)
        exc.message = public_message(exc.message)
        return exc

    async def _respond(
        self,
        state: RequestState,
        req: ChatCompletionRequest | CompletionRequest,
        send: Send,
        headers: dict[str, str],
        echo: str,
        first_before_headers: bool,
    ) -> None:
        turn: _Turn = state.route_data
        if req.stream:
            await self._stream(state, turn, send, headers, first_before_headers)
            return
        await run_choices(state)
        c = state.choices[0]
        status, details = status_of(c.finish_reason)
        body = response_object(
            state.request_id,
            state.created,
            turn.req,
            status=status,
            output=output_items(c.content, c.tool_calls, c.finish_reason),
            usage=usage_object(state.prompt_tokens, c.completion_tokens),
            incomplete_details=details,
        )
        if turn.store is not None:
            await turn.store.put(state.principal.id, body, turn.items)
        data = dumps(body).encode("utf-8")
        await state.record_before_last_byte()
        state.response_started = True
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": response_headers(headers, "application/json", len(data)),
            }
        )
        await send({"type": "http.response.body", "body": data, "more_body": False})

    @staticmethod
    async def _stream(
        state: RequestState,
        turn: _Turn,
        send: Send,
        headers: dict[str, str],
        first_before_headers: bool,
    ) -> None:
        """The Responses event stream of the request's one choice (``first_before_headers``
        as :func:`servehall.api.sse.send_stream` has it)."""
        writer = EventWriter(state.request_id, turn.req)
        writer.created_at = state.created
        events = merged_events(state.choices)
        first: ChoiceEvent | None = None
        if first_before_headers:
            try:
                first = await anext(events)
            except StopAsyncIteration:
                first = None
            except BaseException:
                await events.aclose()
                raise
        state.response_started = True
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": response_headers(headers, "text/event-stream; charset=utf-8"),
            }
        )

        async def emit(out: list[dict[str, Any]]) -> None:
            if out:
                body = b"".join(sse(e) for e in out)
                await send({"type": "http.response.body", "body": body, "more_body": True})

        await emit(writer.start())
        finish: str | None = None
        try:
            try:
                stream = events if first is None else first_then_rest(first, events)
                async for ev in stream:
                    out = writer.text(ev.text) if ev.text else []
                    for d in ev.tool_calls or ():
                        out += writer.call(d)
                    if ev.finish_reason is not None:
                        finish = ev.finish_reason
                    await emit(out)
            finally:
                await events.aclose()
            usage = usage_object(state.prompt_tokens, state.choices[0].completion_tokens)
            tail = writer.finish(finish, usage)
            if turn.store is not None and writer.final is not None:
                try:
                    await turn.store.put(state.principal.id, writer.final, turn.items)
                except ServehallError as exc:
                    log.warning("responses: %s was not stored: %s", state.request_id, exc)
        except ServehallError as exc:
            usage = usage_object(state.prompt_tokens, state.choices[0].completion_tokens)
            tail = writer.fail(exc.code, exc.message, usage)
            state.record.error_code = exc.code
        await state.record_before_last_byte()
        body = b"".join(sse(e) for e in tail)
        await send({"type": "http.response.body", "body": body, "more_body": False})


def _principal(request: Request) -> Principal:
    """The caller, refused with 403 without the ``inference`` scope."""
    principal: Principal = getattr(request.state, "principal", None) or ANONYMOUS
    if not principal.has_scope(SCOPE_INFERENCE):
        raise PermissionDeniedError(
            "This credential lacks the 'inference' scope.", code="insufficient_scope"
        )
    return principal


def _not_found(response_id: str) -> NotFoundError:
    return NotFoundError(
        f"Response with id '{response_id[:64]}' not found.",
        param="response_id",
        code="response_not_found",
    )


async def retrieve_response(request: Request) -> Response:
    """``GET /v1/responses/{response_id}``: the stored response object.

    Raises:
        NotFoundError: 404 ``response_not_found`` (unknown, expired, or another
            principal's).
    """
    api: ApiState = request.app.state.api
    principal = _principal(request)
    response_id = request.path_params["response_id"]
    stored = await api.responses.get(response_id, principal.id)
    if stored is None:
        raise _not_found(response_id)
    return JSONResponse(stored.body)


async def delete_response(request: Request) -> Response:
    """``DELETE /v1/responses/{response_id}``: ``{id, object: "response.deleted",
    deleted: true}``.

    Raises:
        NotFoundError: 404 ``response_not_found``, as for ``GET``.
    """
    api: ApiState = request.app.state.api
    principal = _principal(request)
    response_id = request.path_params["response_id"]
    if not await api.responses.remove(response_id, principal.id):
        raise _not_found(response_id)
    return JSONResponse({"id": response_id, "object": "response.deleted", "deleted": True})


async def stored_response(request: Request) -> Response:
    """``GET`` or ``DELETE /v1/responses/{response_id}`` (one route, so that a 405
    ``Allow`` header lists both)."""
    if request.method == "DELETE":
        return await delete_response(request)
    return await retrieve_response(request)
