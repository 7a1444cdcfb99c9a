"""The wire between HTTP frontends and the serve process (``[server] api_processes``).

With ``api_processes = N > 1`` the serve process (the *primary*) runs the request path —
auth, admission, the engine clients, records — and N frontend processes terminate HTTP
(TLS, HTTP/1.1 and HTTP/2 framing, Hypercorn's ASGI layer, the socket writes of every
streamed event). Each frontend holds one Unix stream connection to the primary and
carries the ASGI messages of all its requests over it, multiplexed by a request id.
This is the split vLLM makes with ``--api-server-count`` (several API processes in front
of one engine core, vllm-project/vllm#17546), drawn where this platform's CPU goes:
docs/performance.md ("Several API processes").

A frame is a 4-byte big-endian length and one MessagePack array of messages
(:mod:`servehall.worker.wire`'s framing). Every message is an array whose first item is
its kind and whose second is the request id (a frontend's counter):

frontend → primary
    ``[OPEN, rid, scope, body, more_body]`` — a request: the ASGI scope's wire fields
    (:data:`SCOPE_KEYS`) and its first body chunk; ``[BODY, rid, body, more_body]`` —
    the next chunk, read only when the primary asked for it (so Hypercorn's flow control
    still holds a client whose body the app is not reading);
    ``[DISCONNECT, rid]`` — the client left; ``[PAUSE, rid]`` / ``[RESUME, rid]`` — the
    client stopped / started reading again (the primary's ``send`` waits meanwhile, so
    ``[server] send_timeout_s`` applies as without frontends); ``[ACCEPT_ERROR, 0, errno]``
    — an ``accept()`` that failed for want of a resource, counted in the primary's
    ``servehall_accept_errors_total``.
primary → frontend
    ``[PULL, rid]`` — the app waits for the next body chunk;
    ``[START, rid, status, headers]``; ``[DATA, rid, body, more_body]``;
    ``[END, rid, complete]`` — the app returned (``complete``: the response was whole).

Messages queued in one event-loop turn leave in one frame (:class:`FrameProtocol`), so a
decode step of 256 streams costs each side a few system calls, not 256.
"""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec

from servehall.worker.wire import MAX_FRAME_BYTES, PREFIX_BYTES

OPEN, BODY, DISCONNECT, PAUSE, RESUME, ACCEPT_ERROR = 0, 1, 2, 3, 4, 5
START, DATA, END, PULL = 10, 11, 12, 13

SCOPE_KEYS: tuple[str, ...] = (
    "type",
    "http_version",
    "method",
    "scheme",
    "path",
    "raw_path",
    "query_string",
    "root_path",
    "headers",
    "client",
    "server",
)
"""The ASGI scope fields that cross the wire. Nothing else does: in particular no key a
frontend's client could set, and none of the primary's own (the batch runner's caller)."""


def wire_scope(scope: dict[str, Any]) -> dict[str, Any]:
    """The fields of an HTTP ``scope`` that are sent to the primary (:data:`SCOPE_KEYS`)."""
    return {k: scope[k] for k in SCOPE_KEYS if k in scope}


def asgi_scope(fields: dict[str, Any]) -> dict[str, Any]:
    """An ASGI HTTP scope from the fields of :func:`wire_scope` (tuples where ASGI has
    them; a fresh ``state``)."""
    scope = dict(fields)
    scope["asgi"] = {"version": "3.0", "spec_version": "2.3"}
    scope["headers"] = [(k, v) for k, v in fields.get("headers", ())]
    for key in ("client", "server"):
        if scope.get(key) is not None:
            scope[key] = tuple(scope[key])
    scope["state"] = {}
    scope["extensions"] = {}
    return scope


class FrameProtocol(asyncio.Protocol):
    """One end of the bridge: frames in, messages out, one frame per loop turn out.

    Subclasses implement :meth:`message_received` and may extend
    :meth:`connection_lost`. :attr:`closed` is a future that resolves when the
    connection is gone.
    """

    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.closed: asyncio.Future[None] = self.loop.create_future()
        self._inbuf = bytearray()
        self._outbox: list[Any] = []
        self._encoder = msgspec.msgpack.Encoder()
        self._decoder = msgspec.msgpack.Decoder()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self._outbox.clear()
        if not self.closed.done():
            self.closed.set_result(None)

    def push(self, message: Any) -> None:
        """Queue ``message``; everything queued in this loop turn leaves as one frame."""
        if self.transport is None:
            return
        if not self._outbox:
            self.loop.call_soon(self._flush)
        self._outbox.append(message)

    def _flush(self) -> None:
        out, self._outbox = self._outbox, []
        if not out or self.transport is None:
            return
        buf = bytearray()
        self._encoder.encode_into(out, buf, PREFIX_BYTES)
        buf[:PREFIX_BYTES] = (len(buf) - PREFIX_BYTES).to_bytes(PREFIX_BYTES, "big")
        self.transport.write(buf)

    def data_received(self, data: bytes) -> None:
        buf = self._inbuf
        buf += data
        pos, end = 0, len(buf)
        batches: list[Any] = []
        with memoryview(buf) as view:
            while end - pos >= PREFIX_BYTES:
                size = int.from_bytes(view[pos : pos + PREFIX_BYTES], "big")
                if size > MAX_FRAME_BYTES:
                    assert self.transport is not None
                    self.transport.abort()  # a corrupt stream: nothing after it can be read
                    return
                if end - pos - PREFIX_BYTES < size:
                    break
                start = pos + PREFIX_BYTES
                batches.append(self._decoder.decode(view[start : start + size]))
                pos = start + size
        del buf[:pos]
        for batch in batches:
            for message in batch:
                self.message_received(message)

    def message_received(self, message: list[Any]) -> None:
        """Handle one message (an array: kind, request id, fields)."""
        raise NotImplementedError
