"""The primary's end of the frontend bridge: the app runs here for every frontend.

:class:`BridgeServer` listens on a Unix socket; each frontend process
(:mod:`servehall.server.frontend`) connects once. For every ``OPEN`` it receives, the
app (the same Starlette app Hypercorn serves with ``api_processes = 1``) runs with a
``receive`` and ``send`` of :class:`BridgedRequest`, so auth, admission, scheduling,
records, metrics and live config stay in this one process and stay global. What the
wire carries is in :mod:`servehall.server.bridge_wire`.

A frontend that goes away (crashed, killed) disconnects all its requests: each ends as a
client disconnect does — recorded, its engine work aborted, its slot freed.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
from collections.abc import Awaitable, Callable
from typing import Any

from servehall.server.bridge_wire import (
    ACCEPT_ERROR,
    BODY,
    DATA,
    DISCONNECT,
    END,
    OPEN,
    PAUSE,
    PULL,
    RESUME,
    START,
    FrameProtocol,
    asgi_scope,
)

log = logging.getLogger("servehall.server")

App = Callable[[dict[str, Any], Any, Any], Awaitable[None]]

_DISCONNECT: dict[str, Any] = {"type": "http.disconnect"}
_ERROR_BODY = (
    b'{"error":{"message":"internal error","type":"server_error","param":null,'
    b'"code":"internal_error"}}'
)


class BridgedRequest:
    """One request from a frontend: its ASGI ``receive`` and ``send``.

    ``receive`` yields the body chunks, then ``http.disconnect`` once the frontend
    reports the client gone (and for ever after). ``send`` forwards the response; it
    waits while the frontend has paused the stream (the client stopped reading), and
    drops messages after a disconnect, as Hypercorn does.
    """

    __slots__ = (
        "_inbox",
        "_waiter",
        "_writable",
        "complete",
        "conn",
        "gone",
        "more_body",
        "pulled",
        "rid",
        "started",
    )

    def __init__(self, conn: BridgeConnection, rid: int) -> None:
        self.conn = conn
        self.rid = rid
        self._inbox: collections.deque[dict[str, Any]] = collections.deque()
        self._waiter: asyncio.Future[None] | None = None
        self._writable: asyncio.Event | None = None  # set while paused
        self.gone = False
        self.more_body = True  # body chunks still to come from the frontend
        self.pulled = False  # a PULL is outstanding
        self.started = False
        self.complete = False

    def feed(self, message: dict[str, Any]) -> None:
        """Queue a ``receive`` message."""
        if message["type"] == "http.request":
            self.more_body = message["more_body"]
            self.pulled = False
        self._inbox.append(message)
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def disconnect(self) -> None:
        """The client left: ``receive`` says so, ``send`` stops waiting and drops."""
        if not self.gone:
            self.gone = True
            self.feed(_DISCONNECT)
        self.resume()

    def pause(self) -> None:
        """The client stopped reading: ``send`` waits until :meth:`resume`."""
        if self._writable is None and not self.gone:
            self._writable = asyncio.Event()

    def resume(self) -> None:
        """The client reads again."""
        if self._writable is not None:
            self._writable.set()
            self._writable = None

    async def receive(self) -> dict[str, Any]:
        """The next ASGI receive message."""
        while not self._inbox:
            if self.gone:
                return _DISCONNECT
            if self.more_body and not self.pulled:
                self.pulled = True
                self.conn.push((PULL, self.rid))
            self._waiter = self.conn.loop.create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        return self._inbox.popleft()

    async def send(self, message: dict[str, Any]) -> None:
        """Forward one ASGI send message to the frontend."""
        while self._writable is not None:
            await self._writable.wait()
        if self.gone:
            return
        kind = message["type"]
        if kind == "http.response.body":
            more = message.get("more_body", False)
            self.conn.push((DATA, self.rid, message.get("body", b""), more))
            if not more:
                self.complete = True
        elif kind == "http.response.start":
            self.started = True
            # ASGI header names and values are bytes already: passed through as they are
            self.conn.push((START, self.rid, message["status"], list(message.get("headers", ()))))


class BridgeConnection(FrameProtocol):
    """The primary's side of one frontend's connection."""

    def __init__(self, server: BridgeServer) -> None:
        super().__init__()
        self.server = server
        self.requests: dict[int, BridgedRequest] = {}

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self.server.connections.add(self)
        self.server.changed()

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        self.server.connections.discard(self)
        self.server.changed()
        for request in list(self.requests.values()):
            request.disconnect()

    def message_received(self, message: list[Any]) -> None:
        kind, rid = message[0], message[1]
        if kind == OPEN:
            opened = self.requests[rid] = BridgedRequest(self, rid)
            opened.feed({"type": "http.request", "body": message[3], "more_body": message[4]})
            task = self.loop.create_task(self._run(opened, asgi_scope(message[2])))
            self.server.tasks.add(task)
            task.add_done_callback(self.server.tasks.discard)
            return
        request = self.requests.get(rid)
        if request is None:
            if kind == ACCEPT_ERROR and self.server.on_accept_error is not None:
                self.server.on_accept_error(message[2])
            return
        if kind == BODY:
            request.feed({"type": "http.request", "body": message[2], "more_body": message[3]})
        elif kind == DISCONNECT:
            request.disconnect()
        elif kind == PAUSE:
            request.pause()
        elif kind == RESUME:
            request.resume()

    async def _run(self, request: BridgedRequest, scope: dict[str, Any]) -> None:
        try:
            await self.server.app(scope, request.receive, request.send)
        except Exception:
            log.exception("the app failed on %s %s", scope.get("method"), scope.get("path"))
            if not request.started and not request.gone:
                await request.send(
                    {
                        "type": "http.response.start",
                        "status": 500,
                        "headers": [(b"content-type", b"application/json")],
                    }
                )
                await request.send({"type": "http.response.body", "body": _ERROR_BODY})
        finally:
            self.requests.pop(request.rid, None)
            self.push((END, request.rid, request.complete))


class BridgeServer:
    """Serves ``app`` to the frontends connected on the Unix socket ``path``.

    Args:
        app: the ASGI app (``scope``, ``receive``, ``send``).
        path: the socket path (created by :meth:`start`, removed by :meth:`close`).
        on_accept_error: called with the errno of each failed ``accept()`` a frontend
            reports (:meth:`~servehall.server.accept_errors.AcceptErrorMonitor.count`).
    """

    def __init__(
        self, app: App, path: str, on_accept_error: Callable[[int], Any] | None = None
    ) -> None:
        self.app = app
        self.path = path
        self.on_accept_error = on_accept_error
        self.connections: set[BridgeConnection] = set()
        self.tasks: set[asyncio.Task[None]] = set()
        self._server: asyncio.AbstractServer | None = None
        self._changed = asyncio.Event()

    def changed(self) -> None:
        """A frontend connected or left (wakes :meth:`wait_connections`)."""
        self._changed.set()

    async def start(self) -> None:
        """Listen on :attr:`path` (owner-only permissions)."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
        loop = asyncio.get_running_loop()
        self._server = await loop.create_unix_server(lambda: BridgeConnection(self), self.path)
        os.chmod(self.path, 0o600)

    async def wait_connections(self, count: int) -> None:
        """Return once at least ``count`` frontends are connected."""
        while len(self.connections) < count:
            self._changed.clear()
            await self._changed.wait()

    @property
    def in_flight(self) -> int:
        """Requests whose app is still running."""
        return len(self.tasks)

    async def close(self, timeout_s: float) -> None:
        """Stop listening, wait up to ``timeout_s`` for the requests in flight, then cancel
        what is left and close the connections."""
        if self._server is not None:
            self._server.close()
        if self.tasks:
            await asyncio.wait(set(self.tasks), timeout=timeout_s)
        for task in list(self.tasks):
            task.cancel()
        if self.tasks:
            await asyncio.wait(set(self.tasks), timeout=5)
        for conn in list(self.connections):
            if conn.transport is not None:
                conn.transport.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
