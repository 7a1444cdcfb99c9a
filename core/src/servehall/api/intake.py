"""What every recorded endpoint does first and last: open the request's state with its
reporting, and answer an error.

:func:`open_state` builds the :class:`~servehall.serving.request.RequestState` of one
request with the listeners that report it when it ends — its trace
(:class:`~servehall.api.tracing.RequestTrace`, when the request is traced), its record
(:class:`~servehall.serving.request.RecordEmitter`, in a ``record`` span when traced) and
the canary guard (:class:`~servehall.rollout.guard.GuardListener`) — so that the state
needs nothing from the layers above it. :func:`send_error` is the error answer of a
request whose response has not started, :func:`end_with_error` ends a request on an
exception, and :func:`end_request` is every request's last step.
"""

from __future__ import annotations

import logging
import time

from starlette.datastructures import Headers
from starlette.types import Receive, Scope, Send

from servehall.admission.principal import ANONYMOUS
from servehall.api.body import drain_body
from servehall.api.errors import error_response
from servehall.api.state import ApiState
from servehall.api.tracing import RequestTrace, request_span
from servehall.batches.call import SCOPE_KEY as BATCH_CALL
from servehall.batches.call import BatchCall
from servehall.errors import PayloadTooLargeError, ServehallError
from servehall.rollout.guard import GuardListener
from servehall.rollout.router import VERSION_HEADER
from servehall.serving.request import RecordEmitter, RequestListener, RequestState

log = logging.getLogger("servehall.api")

STATUS_CLIENT_CLOSED = 499
"""The status of a request whose client went away (nginx's 499)."""


def open_state(api: ApiState, scope: Scope, request_id: str, endpoint: str) -> RequestState:
    """The state of the request in ``scope``: its principal (set by the auth middleware,
    else anonymous), client address, listeners (see the module docstring), the version
    pin header (``x-servehall-model-version``) and, for a batch line
    (:class:`~servehall.batches.call.BatchCall` in the scope), its priority ceiling,
    batch id and ``custom_id``."""
    span = request_span(scope)
    listeners: list[RequestListener] = []
    tracing = api.tracing if span is not None else None
    if tracing is not None and span is not None:
        listeners.append(RequestTrace(tracing, span))
        listeners.append(RecordEmitter(lambda: tracing.span("record")))
    else:
        listeners.append(RecordEmitter())
    listeners.append(GuardListener(api.metrics))
    client = scope.get("client")
    state = RequestState(
        api.host, api.metrics, request_id, endpoint, client[0] if client else None, listeners
    )
    state.set_principal(scope.get("state", {}).get("principal") or ANONYMOUS)
    call = scope.get(BATCH_CALL)
    if isinstance(call, BatchCall):
        state.batch_priority = call.priority
        state.batch_call = call
        state.record.batch_id = call.batch_id
        state.record.custom_id = call.custom_id
    state.pinned_version = Headers(scope=scope).get(VERSION_HEADER)
    return state


async def send_error(
    state: RequestState,
    exc: ServehallError,
    scope: Scope,
    receive: Receive,
    send: Send,
    *,
    body_read: bool = True,
) -> None:
    """Answer ``exc`` as its OpenAI error envelope with the request id (and the version
    header once a version was chosen); a 413 on HTTP/1 closes the connection, and a body
    not read yet (``body_read`` false) is drained. Call only before the response
    started."""
    close = isinstance(exc, PayloadTooLargeError) and scope.get("http_version") in ("1.0", "1.1")
    resp = error_response(exc, close=close)
    resp.headers["x-request-id"] = state.request_id
    if state.served is not None and state.served.version:
        resp.headers[VERSION_HEADER] = state.served.version
    await resp(scope, receive, send)
    if not body_read:
        await drain_body(receive)


async def end_with_error(
    state: RequestState,
    exc: Exception,
    scope: Scope,
    receive: Receive,
    send: Send,
    *,
    body_read: bool = True,
) -> None:
    """End the request on ``exc``: a :class:`~servehall.errors.ServehallError` is
    answered as its error (:func:`send_error`) and recorded with its status and code;
    any other exception is logged with its traceback, answered as a 500 ``server_error``
    and recorded as such. Nothing is sent once the response started."""
    if isinstance(exc, ServehallError):
        if not state.response_started:
            await send_error(state, exc, scope, receive, send, body_read=body_read)
        state.finish(exc.status, error_code=exc.code, prompt_text=state.prompt_text or None)
        return
    log.error("request %s failed", state.request_id, exc_info=exc)
    if not state.response_started:
        await error_response(ServehallError("The server had an error processing the request."))(
            scope, receive, send
        )
    state.finish(500, error_code="server_error", finish_reason="error")


def end_request(state: RequestState) -> None:
    """The last step of every request (in the endpoint's ``finally``): its version is
    counted out of flight (a draining version stops at 0; idle unloading reads
    ``last_used``), and a request not finished yet — cancelled from outside, e.g. at
    server shutdown — still leaves its one record (499 ``cancelled``; ``preempted`` for
    a batch line the runner stopped for online traffic)."""
    if state.served is not None:
        state.served.inflight -= 1
        state.served.last_used = time.monotonic()
    code = "preempted" if preempted(state) else "cancelled"
    state.finish(STATUS_CLIENT_CLOSED, finish_reason="client_disconnect", error_code=code)


def preempted(state: RequestState) -> bool:
    """Whether ``state`` is a batch line the runner stopped for online traffic
    (``[batches] preempt``): its 499 record says ``preempted``."""
    call = state.batch_call
    return isinstance(call, BatchCall) and call.preempted
