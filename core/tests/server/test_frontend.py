"""Tests of servehall.server.frontend: :class:`FrontendApp` served by a real Hypercorn
(in this process, on a free port) forwards every request over a real Unix socket to a
real :class:`~servehall.server.bridge.BridgeServer` running small ASGI apps; httpx over
HTTP/2 and HTTP/1.1 is the client. Covered: bodies, streams, the client's disconnect
reaching the primary's app, flow control (the primary's send waits while the frontend's
client does not read), the primary unreachable (503) or lost mid-answer, lifespan."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from servehall.config.models import ServerSettings
from servehall.server.bridge import BridgeServer
from servehall.server.frontend import PAUSE_AT, FrontendApp, FrontendConnection
from servehall.server.hypercorn import install_connection_fixes
from servehall.server.hypercorn.config import server_config
from servehall.testing.sockets import free_port

Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


class Primary:
    """The primary's app: ``/echo`` answers the body; ``/stream?n=N`` streams N chunks
    then waits for the client's disconnect (recorded in :attr:`disconnects`) unless
    ``end=1``; ``/count?n=N`` streams N chunks counting each ``send`` that returned."""

    def __init__(self) -> None:
        self.disconnects: asyncio.Queue[str] = asyncio.Queue()
        self.sent = 0

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        query = dict(p.split("=") for p in scope["query_string"].decode().split("&") if p)
        headers = [(b"content-type", b"text/plain")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        if scope["path"] == "/echo":
            info = {"method": scope["method"], "http": scope["http_version"], "len": len(body)}
            await send({"type": "http.response.body", "body": json.dumps(info).encode() + body})
            return
        for i in range(int(query.get("n", "1"))):
            await send({"type": "http.response.body", "body": b"%d\n" % i, "more_body": True})
            self.sent += 1
            await asyncio.sleep(0)  # as an engine's stream does between tokens
        if scope["path"] == "/stream" and query.get("end") != "1":
            await self.disconnects.put((await receive())["type"])
            return
        await send({"type": "http.response.body", "body": b"end\n", "more_body": False})


class Setup:
    def __init__(self, primary: Primary, bridge: BridgeServer, conn: FrontendConnection) -> None:
        self.primary = primary
        self.bridge = bridge
        self.conn = conn
        self.url = ""


@pytest.fixture
async def setup(tmp_path: Path) -> AsyncIterator[Setup]:
    """A primary, a frontend connected to it and Hypercorn serving the frontend."""
    from hypercorn.asyncio import serve

    install_connection_fixes()  # as the frontend process does
    primary = Primary()
    bridge = BridgeServer(primary, str(tmp_path / "bridge.sock"))
    await bridge.start()
    loop = asyncio.get_running_loop()
    _, conn = await loop.create_unix_connection(FrontendConnection, bridge.path)
    await asyncio.wait_for(bridge.wait_connections(1), 5)
    s = Setup(primary, bridge, conn)
    port = free_port()
    cfg = server_config(ServerSettings(bind=[f"127.0.0.1:{port}"], graceful_timeout_s=1))
    stop = asyncio.Event()
    task = asyncio.create_task(serve(FrontendApp(conn), cfg, shutdown_trigger=stop.wait))  # type: ignore[arg-type]
    s.url = f"http://127.0.0.1:{port}"
    for _ in range(200):
        try:
            _, w = await asyncio.open_connection("127.0.0.1", port)
            w.close()
            break
        except OSError:
            await asyncio.sleep(0.02)
    yield s
    stop.set()
    with contextlib.suppress(asyncio.TimeoutError):
        await asyncio.wait_for(task, 10)
    await bridge.close(timeout_s=1)


async def test_a_body_crosses_both_ways_over_http2_and_http1(setup: Setup) -> None:
    body = b"x" * 300_000  # several DATA frames / body chunks
    for http2 in (True, False):
        async with httpx.AsyncClient(http1=not http2, http2=http2, timeout=10) as c:
            r = await c.post(setup.url + "/echo", content=body)
        assert r.status_code == 200
        info = json.loads(r.content[: r.content.index(b"}") + 1])
        assert info == {"method": "POST", "http": "2" if http2 else "1.1", "len": len(body)}
        assert r.content.endswith(body)
    assert setup.bridge.in_flight == 0 and setup.conn.streams == {}


async def test_concurrent_streams_on_one_connection(setup: Setup) -> None:
    async with httpx.AsyncClient(http1=False, http2=True, timeout=10) as c:
        rs = await asyncio.gather(
            *(c.get(setup.url + f"/stream?n={n}&end=1") for n in range(1, 31))
        )
    for n, r in enumerate(rs, start=1):
        assert r.text == "".join(f"{i}\n" for i in range(n)) + "end\n"


async def test_a_client_that_leaves_is_a_disconnect_in_the_primary(setup: Setup) -> None:
    """An HTTP/2 stream reset (the connection stays) and an HTTP/1.1 connection closed
    mid-answer: each reaches the primary's app as ``http.disconnect``."""
    import h2.config
    import h2.connection
    import h2.events

    port = int(setup.url.rsplit(":", 1)[1])
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    conn.initiate_connection()
    head = [(":method", "GET"), (":scheme", "http"), (":authority", "x")]
    conn.send_headers(1, [*head, (":path", "/stream?n=3")], end_stream=True)
    writer.write(conn.data_to_send())
    got = b""
    while got.count(b"\n") < 3:
        chunk = await asyncio.wait_for(reader.read(65536), 5)
        assert chunk
        for event in conn.receive_data(chunk):
            if isinstance(event, h2.events.DataReceived):
                got += event.data
        writer.write(conn.data_to_send())
    conn.reset_stream(1)
    writer.write(conn.data_to_send())
    assert await asyncio.wait_for(setup.primary.disconnects.get(), 5) == "http.disconnect"
    # the connection is still served
    conn.send_headers(3, [*head, (":path", "/echo")], end_stream=True)
    writer.write(conn.data_to_send())
    answered = False
    while not answered:
        chunk = await asyncio.wait_for(reader.read(65536), 5)
        assert chunk
        for event in conn.receive_data(chunk):
            answered = answered or isinstance(event, h2.events.StreamEnded)
    writer.close()

    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /stream?n=2 HTTP/1.1\r\nHost: x\r\n\r\n")
    got = b""
    while b"1\n" not in got:
        chunk = await asyncio.wait_for(reader.read(65536), 5)
        assert chunk
        got += chunk
    writer.close()
    assert await asyncio.wait_for(setup.primary.disconnects.get(), 5) == "http.disconnect"
    for _ in range(100):
        if setup.bridge.in_flight == 0 and not setup.conn.streams:
            break
        await asyncio.sleep(0.01)
    assert setup.bridge.in_flight == 0 and setup.conn.streams == {}


async def test_the_primary_waits_while_the_client_does_not_read(setup: Setup) -> None:
    """The frontend's ``send`` (the socket write to a client that does not read) is held:
    the answers queue in the frontend up to :data:`PAUSE_AT`, then the primary's ``send``
    waits; once the client reads again, everything arrives."""
    app = FrontendApp(setup.conn)
    release = asyncio.Event()
    written: list[dict[str, Any]] = []
    calls = [0]

    async def receive() -> dict[str, Any]:
        calls[0] += 1
        if calls[0] == 1:
            return {"type": "http.request", "body": b"", "more_body": False}
        await asyncio.Event().wait()  # the client never leaves
        raise AssertionError

    async def send(message: dict[str, Any]) -> None:
        written.append(message)
        await release.wait()

    scope = {
        "type": "http",
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": "/count",
        "raw_path": b"/count",
        "query_string": b"n=1000",
        "root_path": "",
        "headers": [],
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 2),
    }
    task = asyncio.create_task(app(scope, receive, send))
    await asyncio.sleep(0.5)
    held = setup.primary.sent
    await asyncio.sleep(0.2)
    assert setup.primary.sent == held  # paused
    assert PAUSE_AT <= held < 1000
    assert len(written) == 1  # the frontend is stuck writing the start
    release.set()
    await asyncio.wait_for(task, 10)
    assert setup.primary.sent == 1000
    assert written[0]["status"] == 200 and len(written) == 1 + 1000 + 1
    assert written[-1] == {"type": "http.response.body", "body": b"end\n", "more_body": False}


@pytest.mark.parametrize("http2", [False, True], ids=["http1", "http2"])
async def test_the_primary_lost_mid_answer_cuts_the_stream_and_then_503(
    setup: Setup, http2: bool
) -> None:
    """HTTP/1.1: the connection is closed without a complete body; HTTP/2: the stream is
    reset (``RST_STREAM(INTERNAL_ERROR)``, servehall.server.hypercorn.
    h2_incomplete_reset) while the connection stays. Either way the client learns at
    once that the answer was cut, after the bytes already sent."""
    async with httpx.AsyncClient(http1=not http2, http2=http2, timeout=10) as c:
        got = b""
        with pytest.raises(httpx.RemoteProtocolError):
            async with c.stream("GET", setup.url + "/stream?n=2") as r:
                assert r.status_code == 200
                async for chunk in r.aiter_bytes():
                    got += chunk
                    if got.count(b"\n") >= 1 and setup.conn.transport is not None:
                        setup.conn.transport.close()  # the primary goes away
        assert got.startswith(b"0\n")
        await asyncio.wait_for(setup.conn.closed, 5)
        assert setup.conn.streams == {}
        r = await c.post(setup.url + "/echo", content=b"x")
        assert r.status_code == 503 and r.headers["retry-after"] == "1"
        assert r.json()["error"]["code"] == "unavailable"


async def test_lifespan_and_websocket_scopes() -> None:
    app = FrontendApp(FrontendConnection.__new__(FrontendConnection))
    messages = [{"type": "lifespan.startup"}, {"type": "lifespan.shutdown"}]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return messages.pop(0)

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await app({"type": "lifespan"}, receive, send)
    assert sent == [{"type": "lifespan.startup.complete"}, {"type": "lifespan.shutdown.complete"}]
    await app({"type": "websocket"}, receive, send)  # nothing served
    assert len(sent) == 2
