"""The inference endpoints (``/v1/chat/completions``, ``/v1/completions``) as ASGI apps.

They are raw ASGI callables rather than request/response functions so that the request
path controls the wire: the response starts only after admission (a 503 is still a
status code), each SSE event is one send, and a watcher task notices the client going
away (``http.disconnect``, HTTP/2 ``RST_STREAM``) at any point after the body was read —
waiting in the queue or generating, streaming or not — and cancels the work, which
aborts the engine requests and frees their KV cache.

Steps (DESIGN.md "The request path"): 1 parse + validate → 3 model access (404) and
unsupported parameters → 4 input filters → 5 tokenize + context check → 3 authorize
(reservations) → 6 record-bus admission check + scheduler slot → 7/8/9 engine, output
filters, detokenize, stop strings, SSE → 10 one request record. Authentication (2) runs
in :mod:`servehall.api.auth` before this endpoint is reached. A line of a batch
(:mod:`servehall.batches.runner`) takes the same path; its
:class:`~servehall.batches.call.BatchCall` caps its scheduling priority and names its
batch and ``custom_id`` in the record.

The per-request state is :class:`servehall.serving.request.RequestState` (one object
from the first byte to the record), opened with its reporting by
:func:`servehall.api.intake.open_state`. The endpoint is three calls: the input processor
(:func:`servehall.api.prepare.prepare`: the body → prompt ids, sampling parameters, tool
plan, constraint and admission request), admission
(:meth:`~servehall.api.prepare.Prepared.admit`) and the output side — the choice streams
(:meth:`~servehall.api.prepare.Prepared.choices`) written by :mod:`servehall.api.response`
(the JSON response) or :mod:`servehall.api.sse` (the SSE stream).

``/v1/responses`` (:mod:`servehall.api.responses`) runs this same path: its endpoint
replaces three steps — ``_prepare`` (its body → a chat body), ``_respond`` (the answer's
shape) and ``_public_error`` (errors name its fields).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from typing import Any, Literal

from starlette.requests import ClientDisconnect, Request
from starlette.types import Receive, Scope, Send

from servehall.api.body import check_media_type, parse_json_object, read_body
from servehall.api.disconnect import ClientGone, DisconnectWatch
from servehall.api.intake import (
    STATUS_CLIENT_CLOSED,
    end_request,
    end_with_error,
    open_state,
    preempted,
)
from servehall.api.prepare import prepare
from servehall.api.response import send_completion
from servehall.api.sse import send_stream
from servehall.api.state import ApiState
from servehall.api.wire import ChatCompletionRequest, CompletionRequest
from servehall.errors import InvalidRequestError, ServehallError
from servehall.serving.request import RequestState

log = logging.getLogger("servehall.api")


class InferenceEndpoint:
    """ASGI endpoint for one of the two inference routes."""

    def __init__(self, kind: Literal["chat", "completion"]) -> None:
        self.kind: Literal["chat", "completion"] = kind
        self.endpoint = "/v1/chat/completions" if kind == "chat" else "/v1/completions"
        self.prefix = "chatcmpl-" if kind == "chat" else "cmpl-"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        api: ApiState = scope["app"].state.api
        request = Request(scope, receive)
        rid = self.prefix + uuid.uuid4().hex
        state = open_state(api, scope, rid, self.endpoint)
        try:
            body_read = False
            try:
                check_media_type(request)
                raw = await read_body(request, api.host.settings.server.max_body_bytes)
                body_read = True
            except ClientDisconnect:
                state.finish(STATUS_CLIENT_CLOSED, finish_reason="client_disconnect")
                return
            body = parse_json_object(raw)
            raw = b""  # the parsed body is all that is needed from here
            # the client may leave at any point from here: see servehall.api.disconnect
            watch = DisconnectWatch(receive, send)
            watcher = watch.start()
            api.stalls.add(watch)
            work = watch.work = asyncio.ensure_future(self._handle(api, state, body, watch.send))
            try:
                await asyncio.wait({work, watcher}, return_when=asyncio.FIRST_COMPLETED)
                if not work.done() and not watch.gone:
                    # response complete: let the work finish (its last write may still
                    # wait for the client; a stall then cancels it, watch.stall)
                    await asyncio.wait({work})
            finally:
                gone = (
                    watch.stalled
                    or not work.done()
                    or (not work.cancelled() and isinstance(work.exception(), ClientGone))
                )
                if not work.done():
                    work.cancel()
                    with contextlib.suppress(asyncio.CancelledError, Exception):
                        await work
                api.stalls.discard(watch)
                if gone:
                    if watch.stalled:
                        log.warning(
                            "request %s: the client accepted no response data for %.0f s; "
                            "ended (499 client_stalled)",
                            rid,
                            api.stalls.timeout_s,
                        )
                    state.finish(
                        STATUS_CLIENT_CLOSED,
                        finish_reason="client_disconnect",
                        error_code="client_stalled"
                        if watch.stalled
                        else ("preempted" if preempted(state) else None),
                        prompt_text=state.prompt_text,
                        completion_text=state.completion_text(),
                    )
                await watch.stop()
            if gone:
                return
            work.result()
        except ServehallError as raised:
            exc = self._public_error(raised)
            await end_with_error(state, exc, scope, receive, send, body_read=body_read)
        except Exception as exc:
            await end_with_error(state, exc, scope, receive, send, body_read=body_read)
        finally:
            end_request(state)

    # --- what a route built on this path (``/v1/responses``) replaces --------------------

    async def _prepare(
        self, api: ApiState, state: RequestState, body: dict[str, Any]
    ) -> dict[str, Any]:
        """The body the chat/completion path runs on (here: ``body`` itself)."""
        return body

    def _public_error(self, exc: ServehallError) -> ServehallError:
        """``exc`` as the caller sees it (here: itself)."""
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
        """Send the response of the admitted request (its choices made)."""
        if req.stream:
            await send_stream(
                state,
                self.kind,
                req,
                send,
                headers,
                echo,
                first_before_headers=first_before_headers,
            )
        else:
            await send_completion(state, self.kind, req.model, send, headers, echo)

    # --- the request path ----------------------------------------------------------------

    async def _handle(
        self, api: ApiState, state: RequestState, body: dict[str, Any], send: Send
    ) -> None:
        """Run one request from its parsed body to its record (see the module docstring);
        every refusal raises a :class:`~servehall.errors.ServehallError`."""
        body = await self._prepare(api, state, body)
        prep = await prepare(api, state, self.kind, self.endpoint, body)
        admitted = await prep.admit(api, state)
        try:
            state.choices = prep.choices(state)
            admitted.follow(state.choices)
            try:
                await self._respond(
                    state, prep.req, send, admitted.headers, prep.echo(state), prep.constrained
                )
            except InvalidRequestError:
                if prep.structured is not None:
                    state.structured_outcome = "refused"  # the engine refused the constraint
                raise
            api.readiness.mark_ok(prep.served.key)
            if prep.tools_active:
                state.count_tool_calls()
        finally:
            completion = sum(c.completion_tokens for c in state.choices)
            await admitted.done(len(prep.prompt_ids), completion)
        prep.settle_structured(state)
        state.finish(
            200,
            finish_reason=state.choices[0].finish_reason if state.choices else None,
            prompt_text=state.prompt_text,
            completion_text=state.completion_text(),
        )
