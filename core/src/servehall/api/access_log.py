"""The access log: one line per HTTP request, off by default (``[server] access_log``).

An outermost ASGI middleware, so refusals by the auth middleware (401) and unknown
routes (404) are logged like everything else. Each line goes to the logger
``servehall.access`` at INFO, after the response ended (a stream: after its last event;
a client that went away: when the server noticed)::

    2026-11-30 15:40:02,114 INFO servehall.access: 127.0.0.1 "POST /v1/chat/completions
    HTTP/2" 200 1841B 412.6ms id=chatcmpl-5f0c… principal=sh-4hk64ksg3a

What a line never holds: the query string (it can carry credentials such as
``?api_key=``), any header (``Authorization``, ``X-API-Key``, cookies), the body (prompts,
completions). ``principal`` is the non-secret id the auth plugin assigns (an API key's
public id ``sh-…`` or a JWT subject), ``-`` when there is none; ``id`` is the
``x-request-id`` of the response (the ``request_log`` row's ``request_id``), ``-`` when
the response has none.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

log = logging.getLogger("servehall.access")

MAX_PATH_CHARS = 200
"""Longer paths are cut (with ``…``) so one line stays one short line."""


def _safe(text: str) -> str:
    """Printable ASCII only (a path may carry control characters or quotes)."""
    out = "".join(c if 32 <= ord(c) < 127 and c != '"' else "?" for c in text)
    return out if len(out) <= MAX_PATH_CHARS else out[: MAX_PATH_CHARS - 1] + "…"


class AccessLogMiddleware:
    """Log one line per HTTP request (see the module docstring)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        seen: dict[str, Any] = {"status": None, "bytes": 0, "id": None}

        async def send_and_note(message: Message) -> None:
            if message["type"] == "http.response.start":
                seen["status"] = message["status"]
                for name, value in message.get("headers", []):
                    if name.lower() == b"x-request-id":
                        seen["id"] = value.decode("latin-1")
            elif message["type"] == "http.response.body":
                seen["bytes"] += len(message.get("body", b""))
            await send(message)

        try:
            await self.app(scope, receive, send_and_note)
        finally:
            if log.isEnabledFor(logging.INFO):
                self._line(scope, seen, time.perf_counter() - start)

    @staticmethod
    def _line(scope: Scope, seen: dict[str, Any], elapsed_s: float) -> None:
        client = scope.get("client")
        principal = (scope.get("state") or {}).get("principal")
        pid = getattr(principal, "id", None)
        status = seen["status"] if seen["status"] is not None else "-"
        log.info(
            '%s "%s %s HTTP/%s" %s %dB %.1fms id=%s principal=%s',
            client[0] if client else "-",
            _safe(str(scope.get("method", "-"))),
            _safe(str(scope.get("path", ""))),
            _safe(str(scope.get("http_version", "?"))),
            status,
            seen["bytes"],
            elapsed_s * 1000.0,
            _safe(seen["id"]) if seen["id"] else "-",
            _safe(str(pid)) if pid and pid != "anonymous" else "-",
        )
