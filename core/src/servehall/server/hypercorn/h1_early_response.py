"""HTTP/1.1 answers sent before the request body has arrived (415, 404, 401, 413):
keep the connection usable and let the client read the answer.

Hypercorn 0.18 has three problems with such an *early response* on HTTP/1.1:

1. Once the response is sent it closes the connection at once, without
   ``Connection: close`` and with unread request bytes in the socket, so the kernel
   answers the client's remaining body with a reset. A client's next request on the
   same connection fails (case N27), and a client that writes its whole body before it
   reads — async httpx posting 5 MB — gets a read error instead of the 413 (issue 16
   item 5; RFC 9112 §9.6 asks a server to keep reading before it closes).
2. Closing the stream puts ``http.disconnect`` on the app's bounded receive queue with a
   blocking ``put``. When the client sends its body at full speed that queue is full
   (the reader task is itself blocked on it), and the app is inside its own ``send``:
   the connection deadlocks — the socket stays ``ESTABLISHED`` with unread data, and
   SIGTERM waits the whole graceful timeout (case N28).
3. A client that sent ``Expect: 100-continue`` and gets a final answer may never send
   the body, so the connection cannot be reused unless it is closed.

:func:`install` fixes them in Hypercorn's layer (no fork, no copy of its code):

* **Read and drop, then keep alive.** When the app has finished its response while
  the request body is still arriving, a stand-in stream reads the rest of the body and
  drops it; when the body ends within the budget the connection is recycled for the
  next request exactly as after a normal request.
* **Say ``Connection: close`` and linger.** When the rest cannot be read within the
  budget — a declared ``Content-Length`` whose unread part exceeds
  ``drain_bytes``, a chunked body (length unknown), or a client still waiting for
  ``100 Continue`` — the response gets ``Connection: close`` before it is sent. The
  app can also say it itself (the 413 does). After such a response the server still
  reads and drops the body until it ends, the client closes, ``drain_bytes`` have been
  dropped or ``drain_s`` have passed, and only then closes; so the client's writes
  never meet a reset before it reads the answer.
* **Never block on the disconnect.** When a stream closes while its receive queue is
  full, the unread request-body messages are dropped from the queue so that
  ``http.disconnect`` always fits.

The budget is ``drain_bytes`` (bytes dropped after the response) and ``drain_s``
(seconds after the response), read from the Hypercorn ``Config`` attributes
:data:`DRAIN_BYTES_ATTR` / :data:`DRAIN_S_ATTR` (set by
:func:`servehall.server.serve.hypercorn_config` from ``[server] early_response_drain_bytes``
and ``early_response_drain_s``), else :data:`DEFAULT_DRAIN_BYTES` /
:data:`DEFAULT_DRAIN_S`. A server shutting down closes at once, as Hypercorn does.

Upstream: the same code is in Hypercorn's main branch
(``H11Protocol._maybe_recycle`` closes when ``their_state`` is not ``DONE``;
``HTTPStream.handle(StreamClosed)`` awaits ``app_put``); listed in docs/api.md, "Known
deviations from upstream Hypercorn". Idempotent.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from typing import Any

DEFAULT_DRAIN_BYTES = 64 * 1024 * 1024
"""Bytes of an unread request body the server reads and drops after an early answer."""
DEFAULT_DRAIN_S = 10.0
"""Seconds after an early answer during which the server keeps reading the body."""
DRAIN_BYTES_ATTR = "servehall_early_response_drain_bytes"
DRAIN_S_ATTR = "servehall_early_response_drain_s"

_INSTALLED = False


def _budget(config: Any) -> tuple[int, float]:
    return (
        int(getattr(config, DRAIN_BYTES_ATTR, DEFAULT_DRAIN_BYTES)),
        float(getattr(config, DRAIN_S_ATTR, DEFAULT_DRAIN_S)),
    )


def _says_close(headers: list[tuple[bytes, bytes]]) -> bool:
    for name, value in headers:
        if name.lower() == b"connection" and b"close" in value.lower():
            return True
    return False


def unread_body_bytes(connection: Any) -> int | None:
    """Bytes of the current request body that ``connection`` (an ``h11.Connection``
    reading a request) has not received yet: ``0`` when the body is complete, ``None``
    when unknown (chunked transfer coding)."""
    import h11

    if connection.their_state is not h11.SEND_BODY:
        return 0
    remaining = getattr(getattr(connection, "_reader", None), "_remaining", None)
    return remaining if isinstance(remaining, int) else None


def must_close(connection: Any, drain_bytes: int) -> bool:
    """Whether an answer sent now, before the request body is complete, must say
    ``Connection: close``: the client may never send the body (it waits for
    ``100 Continue``), or the unread part is unknown or larger than ``drain_bytes``."""
    import h11

    if connection.their_state is not h11.SEND_BODY:
        return False
    if connection.they_are_waiting_for_100_continue:
        return True
    unread = unread_body_bytes(connection)
    return unread is None or unread > drain_bytes


class _DrainStream:
    """Stands in for a finished stream while the rest of its request body is read and
    dropped (see the module docstring). ``close_after`` is True when the response said
    ``Connection: close``: the connection then closes once the body has ended."""

    idle = False

    def __init__(self, protocol: Any, drain_bytes: int) -> None:
        self.protocol = protocol
        self.left = drain_bytes
        self.done = asyncio.Event()

    async def handle(self, event: Any) -> None:
        from hypercorn.protocol.events import Body, EndBody, StreamClosed

        if isinstance(event, Body):
            self.left -= len(event.data)
            if self.left < 0:
                await self.finish(close=True)
        elif isinstance(event, EndBody):
            await self.finish(close=False)
        elif isinstance(event, StreamClosed):  # the connection ended meanwhile
            self.done.set()

    async def finish(self, *, close: bool) -> None:
        """Stop draining: close the connection, or recycle it for the next request (which
        closes it anyway when the response said ``Connection: close``)."""
        from hypercorn.events import Closed

        if self.done.is_set():
            return
        self.done.set()
        proto = self.protocol
        if proto.stream is self:
            proto.stream = None
        if close:
            await proto.can_read.set()
            await proto.send(Closed())
        else:
            await _ORIGINAL["maybe_recycle"](proto)

    async def watch(self, drain_s: float) -> None:
        """Bound the drain in time; a server shutting down ends it at once."""
        waits = {
            asyncio.ensure_future(self.done.wait()),
            asyncio.ensure_future(self.protocol.context.terminated.wait()),
        }
        try:
            await asyncio.wait(waits, timeout=drain_s, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()
        await self.finish(close=True)


_ORIGINAL: dict[str, Any] = {}


def install() -> None:
    """Patch Hypercorn's HTTP/1.1 protocol and HTTP stream once per process (see the
    module docstring)."""
    global _INSTALLED
    if _INSTALLED:
        return
    import h11
    from hypercorn.protocol.events import Response, StreamClosed
    from hypercorn.protocol.h11 import H11Protocol
    from hypercorn.protocol.http_stream import HTTPStream

    _ORIGINAL["maybe_recycle"] = H11Protocol._maybe_recycle
    original_stream_send = H11Protocol.stream_send
    original_stream_handle = HTTPStream.handle

    async def stream_send(self: Any, event: Any) -> None:
        if (
            isinstance(event, Response)
            and event.status_code >= 200
            and isinstance(self.connection, h11.Connection)
            and must_close(self.connection, _budget(self.config)[0])
            and not _says_close(event.headers)
        ):
            event = dataclasses.replace(event, headers=[*event.headers, (b"connection", b"close")])
        await original_stream_send(self, event)

    async def _maybe_recycle(self: Any) -> None:
        conn = self.connection
        if (
            isinstance(conn, h11.Connection)
            and not isinstance(self.stream, _DrainStream)
            and not self.context.terminated.is_set()
        ):
            await self._close_stream()
            if conn.their_state is h11.SEND_BODY and conn.our_state in (h11.DONE, h11.MUST_CLOSE):
                drain_bytes, drain_s = _budget(self.config)
                drain = _DrainStream(self, drain_bytes)
                self.stream = drain
                await self.can_read.set()
                self.task_group.spawn(drain.watch, drain_s)
                return
        await _ORIGINAL["maybe_recycle"](self)

    async def handle(self: Any, event: Any) -> None:
        if isinstance(event, StreamClosed) and not self.closed:
            put = getattr(self, "app_put", None)
            queue = getattr(put, "__self__", None)
            if isinstance(queue, asyncio.Queue) and queue.full():
                kept = []
                with contextlib.suppress(asyncio.QueueEmpty):
                    while True:
                        message = queue.get_nowait()
                        if message.get("type") != "http.request":
                            kept.append(message)
                for message in kept:
                    queue.put_nowait(message)
        await original_stream_handle(self, event)

    H11Protocol.stream_send = stream_send  # type: ignore[method-assign]
    H11Protocol._maybe_recycle = _maybe_recycle  # type: ignore[method-assign]
    HTTPStream.handle = handle  # type: ignore[method-assign]
    _INSTALLED = True
