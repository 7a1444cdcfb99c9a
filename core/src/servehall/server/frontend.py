"""One HTTP frontend process (``[server] api_processes = N > 1``).

Started by the primary (:mod:`servehall.server.frontends`) as
``python -m servehall.server.frontend '<json>'`` with the listening sockets inherited.
It runs Hypercorn on those sockets — HTTP/1.1, HTTP/2, TLS, with the same connection
corrections and limits as a single-process server — and an ASGI app,
:class:`FrontendApp`, that forwards each request over one Unix connection to the primary
and writes back what the primary answers (:mod:`servehall.server.bridge_wire`). It
imports no engine, model or database code: its whole job is HTTP.

Flow control: the rest of a request body is read a chunk at a time, when the primary
asks (``PULL``). A stream whose client stops reading accumulates answers here; above
:data:`PAUSE_AT` queued messages the frontend asks the primary to pause it, below
:data:`RESUME_AT` to resume. A frontend exits when its connection to the primary is
lost (and, with the kernel's help, when the primary dies).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import json
import logging
import signal
import socket
import sys
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
    wire_scope,
)

log = logging.getLogger("servehall.server")

PAUSE_AT = 64
"""Answers queued for one stream (its client is not reading) above which it is paused."""
RESUME_AT = 8
"""Queued answers below which a paused stream is resumed."""

_UNAVAILABLE = (
    b'{"error":{"message":"the serve process is not reachable","type":"server_error",'
    b'"param":null,"code":"unavailable"}}'
)


class _Stream:
    """The primary's answers to one request, in order."""

    __slots__ = ("inbox", "paused", "pulls", "waiter")

    def __init__(self) -> None:
        self.inbox: collections.deque[list[Any]] = collections.deque()
        self.waiter: asyncio.Future[None] | None = None
        self.paused = False
        self.pulls: asyncio.Queue[None] | None = None  # the primary's PULLs (body to come)


class FrontendConnection(FrameProtocol):
    """The frontend's side of the bridge: routes the primary's answers to their streams."""

    def __init__(self) -> None:
        super().__init__()
        self.streams: dict[int, _Stream] = {}

    def message_received(self, message: list[Any]) -> None:
        rid = message[1]
        stream = self.streams.get(rid)
        if stream is None:
            return
        if message[0] == PULL:
            if stream.pulls is not None:
                stream.pulls.put_nowait(None)
            return
        stream.inbox.append(message)
        # checked here, not after each write: while the client does not read, the write
        # (Hypercorn's send) does not return, and the answers pile up meanwhile
        if not stream.paused and len(stream.inbox) > PAUSE_AT:
            stream.paused = True
            self.push((PAUSE, rid))
        waiter = stream.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        for rid, stream in list(self.streams.items()):
            stream.inbox.append([END, rid, False])
            if stream.waiter is not None and not stream.waiter.done():
                stream.waiter.set_result(None)


class FrontendApp:
    """The ASGI app of a frontend: each HTTP request goes to the primary over ``conn``."""

    def __init__(self, conn: FrontendConnection) -> None:
        self.conn = conn
        self._ids = itertools.count(1)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        if scope["type"] != "http":
            return  # no websocket routes: Hypercorn closes the connection
        conn = self.conn
        first = await receive()
        if first["type"] != "http.request":
            return
        if conn.transport is None:
            await _send_unavailable(send)
            return
        rid = next(self._ids)
        stream = _Stream()
        conn.streams[rid] = stream
        more = first.get("more_body", False)
        if more:
            stream.pulls = asyncio.Queue()
        conn.push((OPEN, rid, wire_scope(scope), first.get("body", b""), more))
        pump = asyncio.create_task(self._pump(rid, stream, receive))
        complete = False
        try:
            complete = await self._answer(rid, stream, send)
        finally:
            pump.cancel()
            conn.streams.pop(rid, None)
            if not complete:
                conn.push((DISCONNECT, rid))
        # an answer cut off (the primary went away) ends here too: Hypercorn then closes
        # the stream (HTTP/2) or the connection (HTTP/1.1) without a complete body

    async def _answer(self, rid: int, stream: _Stream, send: Any) -> bool:
        """Write the primary's answers to ``send`` until its ``END``; True if it was whole."""
        conn = self.conn
        inbox = stream.inbox
        while True:
            while not inbox:
                stream.waiter = conn.loop.create_future()
                await stream.waiter
            message = inbox.popleft()
            kind = message[0]
            if kind == DATA:
                await send(
                    {"type": "http.response.body", "body": message[2], "more_body": message[3]}
                )
            elif kind == START:
                headers = [(k, v) for k, v in message[3]]
                start = {"type": "http.response.start", "status": message[2], "headers": headers}
                await send(start)
            elif kind == END:
                return bool(message[2])
            if stream.paused and len(inbox) < RESUME_AT:
                stream.paused = False
                conn.push((RESUME, rid))

    async def _pump(self, rid: int, stream: _Stream, receive: Any) -> None:
        """Forward the rest of the body, a chunk per PULL of the primary, then the
        client's disconnect."""
        conn = self.conn
        pulls = stream.pulls
        more = pulls is not None
        while True:
            if more and pulls is not None:
                await pulls.get()
            message = await receive()
            if message["type"] == "http.disconnect":
                conn.push((DISCONNECT, rid))
                return
            if more:
                more = message.get("more_body", False)
                conn.push((BODY, rid, message.get("body", b""), more))


async def _lifespan(receive: Any, send: Any) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


async def _send_unavailable(send: Any) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": 503,
            "headers": [(b"content-type", b"application/json"), (b"retry-after", b"1")],
        }
    )
    await send({"type": "http.response.body", "body": _UNAVAILABLE})


def accept_one_per_turn(loop: asyncio.AbstractEventLoop) -> None:
    """Make ``loop`` accept at most one connection each time a listening socket is ready.

    asyncio's selector loop accepts up to the listen backlog (100) in one go
    (``BaseSelectorEventLoop._accept_connection``, bpo-27906). With one socket shared by
    N frontends that hands a burst of new connections (a load generator's, a
    reconnecting client pool's) to whichever frontend woke first. Taking one per wakeup
    lets them take turns, and a busy frontend, slower to come back to its poll, takes
    fewer: the kernel's wake-all on a shared listening socket becomes load-aware
    balancing. A selector loop's private method is wrapped; other loops are left alone.
    """
    accept = getattr(loop, "_accept_connection", None)
    if accept is None:
        return

    def accept_one(
        protocol_factory: Any,
        sock: Any,
        sslcontext: Any = None,
        server: Any = None,
        backlog: int = 100,
        *args: Any,
    ) -> Any:
        return accept(protocol_factory, sock, sslcontext, server, 1, *args)

    loop._accept_connection = accept_one  # type: ignore[attr-defined]


def _reuses_port(fd: int) -> bool:
    """Whether the listening socket ``fd`` has ``SO_REUSEPORT`` set: then it is this
    frontend's own copy (:func:`servehall.server.frontends.listening_groups`) and the
    kernel already spreads connections over the frontends."""
    reuse = getattr(socket, "SO_REUSEPORT", None)
    if reuse is None:
        return False
    with socket.fromfd(fd, socket.AF_INET, socket.SOCK_STREAM) as sock:
        return bool(sock.getsockopt(socket.SOL_SOCKET, reuse))


async def run_frontend(options: dict[str, Any]) -> None:
    """Connect to the primary at ``options["socket"]``, then serve Hypercorn on the
    inherited listening descriptors ``options["fds"]`` until SIGTERM/SIGINT or until the
    primary goes away."""
    from hypercorn.asyncio import serve as hypercorn_serve

    from servehall.api.disconnect import install_closed_write_filter
    from servehall.config.models import ServerSettings
    from servehall.server.accept_errors import AcceptErrorMonitor
    from servehall.server.hypercorn import install_connection_fixes
    from servehall.server.hypercorn.config import server_config

    server = ServerSettings.model_validate(options["server"])
    cfg = server_config(server)
    cfg.bind = [f"fd://{fd}" for fd in options["fds"]]
    install_connection_fixes()
    install_closed_write_filter()
    loop = asyncio.get_running_loop()
    if not all(_reuses_port(fd) for fd in options["fds"]):
        accept_one_per_turn(loop)  # sockets shared with the other frontends
    _, conn = await loop.create_unix_connection(FrontendConnection, options["socket"])

    class Monitor(AcceptErrorMonitor):  # logs here, counted in the primary's /metrics
        def count(self, number: int) -> str:
            conn.push((ACCEPT_ERROR, 0, number))
            return super().count(number)

    Monitor().install(loop)
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    # SIGHUP re-reads the config in the serve process; a hangup sent to the whole process
    # group (a closed terminal) must not end the frontends
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    conn.closed.add_done_callback(lambda _: stop.set())
    import gc

    gc.collect()
    gc.freeze()
    await hypercorn_serve(FrontendApp(conn), cfg, shutdown_trigger=stop.wait)  # type: ignore[arg-type]
    if conn.transport is not None:
        conn.transport.close()


def main(argv: list[str] | None = None) -> None:
    """``python -m servehall.server.frontend '<options as JSON>'``."""
    from servehall.server.logs import configure_logging

    options = json.loads((argv if argv is not None else sys.argv[1:])[0])
    configure_logging(options["server"].get("log_level", "info"))
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(run_frontend(options))


if __name__ == "__main__":
    main()
