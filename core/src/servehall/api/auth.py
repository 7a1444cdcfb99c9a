"""Authentication middleware (step 2): every route except ``server.auth_allow_paths``.

Pure ASGI, wrapped around the whole app, so it covers core routes, plugin routes from
``servehall_register_routes`` and unknown paths alike (an anonymous caller cannot probe
which routes exist). The principal goes to ``scope["state"]["principal"]``
(``request.state.principal``):

* no plugin implements ``servehall_authenticate`` →
  :data:`~servehall.admission.principal.ANONYMOUS`;
* a plugin returns a principal → that principal (first one wins);
* none does, or one raises ``AuthenticationError`` → 401 with ``WWW-Authenticate: Bearer``;
  another ``ServehallError`` (403, 429 …) keeps its status; any other exception from a
  plugin fails closed as 401 (logged), never a 500.

A request the batch runner sends from inside this process carries a
:class:`~servehall.batches.call.BatchCall` under the scope key
:data:`~servehall.batches.call.SCOPE_KEY`: its principal (the batch's owner as stored) is
taken as is. A server builds scopes from the network with fixed keys and plain values,
so no client can put one there.

Each refusal writes one request record (status 401/403/429, or 503 when the key store
cannot answer; no principal), and its response carries that record's ``x-request-id``.
"""

from __future__ import annotations

import logging
import uuid

from starlette.requests import Request
from starlette.types import ASGIApp, Receive, Scope, Send

from servehall.admission.principal import ANONYMOUS
from servehall.api.body import drain_body
from servehall.api.errors import error_response
from servehall.api.intake import open_state
from servehall.api.state import ApiState
from servehall.api.tracing import maybe_span, request_span
from servehall.batches.call import SCOPE_KEY as BATCH_CALL
from servehall.batches.call import BatchCall
from servehall.errors import AuthenticationError, ServehallError

log = logging.getLogger("servehall.auth")


class AuthMiddleware:
    """See the module docstring."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        api: ApiState = scope["app"].state.api
        host = api.host
        state = scope.setdefault("state", {})
        call = scope.get(BATCH_CALL)
        if isinstance(call, BatchCall):
            state["principal"] = call.principal
            await self.app(scope, receive, send)
            return
        if scope["path"] in host.settings.server.auth_allow_paths:
            await self.app(scope, receive, send)
            return
        if not host.plugins.has_authenticators:
            state["principal"] = ANONYMOUS
            await self.app(scope, receive, send)
            return
        try:
            traced = api.tracing if request_span(scope) is not None else None
            with maybe_span(traced, "auth"):
                principal = await host.plugins.authenticate(host, Request(scope))
            if principal is None:
                raise AuthenticationError()
        except ServehallError as exc:
            await self._refuse(api, scope, receive, send, exc)
            return
        except Exception:
            log.exception("an authentication plugin failed; refusing the request")
            await self._refuse(api, scope, receive, send, AuthenticationError())
            return
        state["principal"] = principal
        await self.app(scope, receive, send)

    @staticmethod
    async def _refuse(
        api: ApiState, scope: Scope, receive: Receive, send: Send, exc: ServehallError
    ) -> None:
        ctx = open_state(api, scope, "req-" + uuid.uuid4().hex, str(scope["path"])[:200])
        resp = error_response(exc)
        resp.headers["x-request-id"] = ctx.request_id
        await resp(scope, receive, send)
        ctx.finish(exc.status, error_code=exc.code)
        if scope.get("method") not in ("GET", "HEAD", "OPTIONS"):
            await drain_body(receive)
