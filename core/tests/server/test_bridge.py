"""Tests of servehall.server.bridge: a real :class:`BridgeServer` on a Unix socket runs
tiny ASGI apps for a client speaking the wire of :mod:`servehall.server.bridge_wire`
(what a frontend process sends): body chunks, streamed answers, the client's disconnect,
pause/resume, a lost connection, an app that raises, and closing with requests in
flight."""

from __future__ import annotations

import asyncio
import collections
import json
import os
import stat
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from servehall.server.bridge import BridgeServer
from servehall.server.bridge_wire import (
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
)

Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]

SCOPE = {
    "type": "http",
    "http_version": "2",
    "method": "POST",
    "scheme": "http",
    "path": "/echo",
    "raw_path": b"/echo",
    "query_string": b"",
    "root_path": "",
    "headers": [[b"content-type", b"text/plain"]],
    "client": ["127.0.0.1", 40000],
    "server": ["127.0.0.1", 8000],
}


class Client(FrameProtocol):
    """A frontend's end of the wire: the primary's answers queued per request id."""

    def __init__(self) -> None:
        super().__init__()
        self.answers: dict[int, asyncio.Queue[list[Any]]] = collections.defaultdict(asyncio.Queue)
        self.pulls: dict[int, asyncio.Queue[None]] = collections.defaultdict(asyncio.Queue)

    def message_received(self, message: list[Any]) -> None:
        if message[0] == PULL:  # the app waits for the next body chunk
            self.pulls[message[1]].put_nowait(None)
            return
        self.answers[message[1]].put_nowait(message)

    async def pulled(self, rid: int, timeout: float = 5.0) -> None:
        """Wait for the primary's next ``PULL`` of ``rid``."""
        await asyncio.wait_for(self.pulls[rid].get(), timeout)

    async def next(self, rid: int, timeout: float = 5.0) -> list[Any]:
        """The next answer to ``rid``."""
        return await asyncio.wait_for(self.answers[rid].get(), timeout)

    async def until_end(self, rid: int) -> list[list[Any]]:
        """Every answer to ``rid`` up to and including its ``END``."""
        out = [await self.next(rid)]
        while out[-1][0] != END:
            out.append(await self.next(rid))
        return out


class Bridge:
    """A started :class:`BridgeServer` and a way to connect clients to it."""

    def __init__(self, server: BridgeServer) -> None:
        self.server = server

    async def connect(self) -> Client:
        loop = asyncio.get_running_loop()
        _, client = await loop.create_unix_connection(Client, self.server.path)
        return client


async def echo_app(scope: dict[str, Any], receive: Receive, send: Send) -> None:
    """Answers the request's whole body, with the scope's method/path/client as headers."""
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    headers = [
        (b"x-scope", json.dumps([scope["method"], scope["path"], list(scope["client"])]).encode())
    ]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": body})


@pytest.fixture
async def bridge(tmp_path: Path) -> AsyncIterator[Callable[[Any], Awaitable[Bridge]]]:
    """``await bridge(app)``: a started :class:`BridgeServer` serving ``app``."""
    servers: list[BridgeServer] = []

    async def make(app: Any) -> Bridge:
        server = BridgeServer(app, str(tmp_path / f"bridge-{len(servers)}.sock"))
        await server.start()
        servers.append(server)
        return Bridge(server)

    yield make
    for server in servers:
        await server.close(timeout_s=1.0)


async def test_a_body_in_chunks_is_answered_with_the_scope(bridge: Any) -> None:
    b = await bridge(echo_app)
    assert stat.S_IMODE(os.stat(b.server.path).st_mode) == 0o600
    c = await b.connect()
    c.push((OPEN, 1, SCOPE, b"one ", True))
    await c.pulled(1)  # a chunk is asked for only once the app waits for it
    c.push((BODY, 1, b"two ", True))
    await c.pulled(1)
    c.push((BODY, 1, b"three", False))
    start, data, end = await c.until_end(1)
    assert c.pulls[1].empty()
    assert start[:3] == [START, 1, 200]
    assert json.loads(dict(start[3])[b"x-scope"]) == ["POST", "/echo", ["127.0.0.1", 40000]]
    assert data == [DATA, 1, b"one two three", False]
    assert end == [END, 1, True]
    assert b.server.in_flight == 0


async def test_many_requests_on_one_connection_stay_apart(bridge: Any) -> None:
    b = await bridge(echo_app)
    c = await b.connect()
    for rid in range(1, 21):
        c.push((OPEN, rid, SCOPE, str(rid).encode(), False))
    for rid in range(1, 21):
        answers = await c.until_end(rid)
        assert answers[1] == [DATA, rid, str(rid).encode(), False]


async def test_a_streamed_answer_arrives_in_order(bridge: Any) -> None:
    async def app(scope: dict[str, Any], receive: Receive, send: Send) -> None:
        await receive()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        for i in range(5):
            await send({"type": "http.response.body", "body": b"%d" % i, "more_body": True})
            await asyncio.sleep(0.001)
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    b = await bridge(app)
    c = await b.connect()
    c.push((OPEN, 1, SCOPE, b"", False))
    answers = await c.until_end(1)
    assert [a[0] for a in answers] == [START, *[DATA] * 6, END]
    assert [a[2] for a in answers[1:6]] == [b"0", b"1", b"2", b"3", b"4"]
    assert answers[6] == [DATA, 1, b"", False] and answers[7] == [END, 1, True]


async def test_the_clients_disconnect_reaches_receive(bridge: Any) -> None:
    seen: asyncio.Queue[dict[str, Any]] = asyncio.Queue()

    async def app(scope: dict[str, Any], receive: Receive, send: Send) -> None:
        await receive()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"first", "more_body": True})
        message = await receive()  # waits for the disconnect
        await seen.put(message)
        await seen.put(await receive())  # and says so for ever after
        await send({"type": "http.response.body", "body": b"dropped", "more_body": False})

    b = await bridge(app)
    c = await b.connect()
    c.push((OPEN, 1, SCOPE, b"", False))
    assert (await c.next(1))[0] == START
    assert (await c.next(1))[2] == b"first"
    c.push((DISCONNECT, 1))
    assert await asyncio.wait_for(seen.get(), 5) == {"type": "http.disconnect"}
    assert await asyncio.wait_for(seen.get(), 5) == {"type": "http.disconnect"}
    # what the app sends after the disconnect is dropped; the request ends incomplete
    assert await c.next(1) == [END, 1, False]


async def test_send_waits_while_paused(bridge: Any) -> None:
    sent: list[int] = []

    async def app(scope: dict[str, Any], receive: Receive, send: Send) -> None:
        await receive()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        for i in range(100):
            await send({"type": "http.response.body", "body": b"%d" % i, "more_body": True})
            sent.append(i)
            await asyncio.sleep(0.002)
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    b = await bridge(app)
    c = await b.connect()
    c.push((OPEN, 1, SCOPE, b"", False))
    assert (await c.next(1))[0] == START
    await c.next(1)
    c.push((PAUSE, 1))
    await asyncio.sleep(0.1)  # the pause lands; at most one send was under way
    held = len(sent)
    await asyncio.sleep(0.2)
    assert len(sent) <= held + 1 < 100  # the app's send waits
    c.push((RESUME, 1))
    answers = await c.until_end(1)
    assert len(sent) == 100 and answers[-1] == [END, 1, True]


async def test_a_disconnect_while_paused_releases_send(bridge: Any) -> None:
    returned = asyncio.Event()

    async def app(scope: dict[str, Any], receive: Receive, send: Send) -> None:
        await receive()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await asyncio.sleep(0.1)  # the pause arrives meanwhile
        await send({"type": "http.response.body", "body": b"x", "more_body": True})
        returned.set()

    b = await bridge(app)
    c = await b.connect()
    c.push((OPEN, 1, SCOPE, b"", False))
    assert (await c.next(1))[0] == START
    c.push((PAUSE, 1))
    await asyncio.sleep(0.3)
    assert not returned.is_set()
    c.push((DISCONNECT, 1))
    await asyncio.wait_for(returned.wait(), 5)
    assert await c.next(1) == [END, 1, False]


async def test_a_lost_connection_disconnects_every_request(bridge: Any) -> None:
    disconnected: list[str] = []
    running = asyncio.Event()

    async def app(scope: dict[str, Any], receive: Receive, send: Send) -> None:
        await receive()
        running.set()
        message = await receive()
        disconnected.append(message["type"])

    b = await bridge(app)
    c = await b.connect()
    other = await b.connect()
    await asyncio.wait_for(b.server.wait_connections(2), 5)
    for rid in (1, 2, 3):
        c.push((OPEN, rid, SCOPE, b"", False))
    other.push((OPEN, 1, SCOPE, b"", False))
    await asyncio.wait_for(running.wait(), 5)
    while b.server.in_flight < 4:
        await asyncio.sleep(0.01)
    assert c.transport is not None
    c.transport.abort()  # the frontend died
    for _ in range(500):
        if len(disconnected) == 3:
            break
        await asyncio.sleep(0.01)
    assert disconnected == ["http.disconnect"] * 3
    assert b.server.in_flight == 1  # the other frontend's request is untouched
    assert len(b.server.connections) == 1
    other.push((DISCONNECT, 1))
    assert await other.next(1) == [END, 1, False]


async def test_an_app_that_raises_answers_500(bridge: Any) -> None:
    async def app(scope: dict[str, Any], receive: Receive, send: Send) -> None:
        await receive()
        if scope["path"] == "/late":
            await send({"type": "http.response.start", "status": 200, "headers": []})
        raise RuntimeError("boom")

    b = await bridge(app)
    c = await b.connect()
    c.push((OPEN, 1, SCOPE, b"", False))
    start, data, end = await c.until_end(1)
    assert start[:3] == [START, 1, 500]
    assert dict(start[3])[b"content-type"] == b"application/json"
    assert json.loads(data[2])["error"]["code"] == "internal_error" and data[3] is False
    assert end == [END, 1, True]
    # after the answer started, nothing more can be said: the request ends incomplete
    c.push((OPEN, 2, {**SCOPE, "path": "/late"}, b"", False))
    start, end = await c.until_end(2)
    assert start[:3] == [START, 2, 200] and end == [END, 2, False]


async def test_messages_for_unknown_requests_are_ignored(bridge: Any) -> None:
    b = await bridge(echo_app)
    c = await b.connect()
    c.push((BODY, 99, b"x", False))
    c.push((DISCONNECT, 98))
    c.push((PAUSE, 97))
    c.push((OPEN, 1, SCOPE, b"ok", False))
    answers = await c.until_end(1)
    assert answers[1][2] == b"ok"


async def test_close_waits_for_requests_then_cancels_the_rest(tmp_path: Path) -> None:
    finished: list[str] = []
    cancelled: list[str] = []

    async def app(scope: dict[str, Any], receive: Receive, send: Send) -> None:
        await receive()
        try:
            await asyncio.sleep(0.2 if scope["path"] == "/short" else 60)
            finished.append(scope["path"])
        except asyncio.CancelledError:
            cancelled.append(scope["path"])
            raise

    server = BridgeServer(app, str(tmp_path / "b.sock"))
    await server.start()
    loop = asyncio.get_running_loop()
    _, c = await loop.create_unix_connection(Client, server.path)
    c.push((OPEN, 1, {**SCOPE, "path": "/short"}, b"", False))
    c.push((OPEN, 2, {**SCOPE, "path": "/long"}, b"", False))
    while server.in_flight < 2:
        await asyncio.sleep(0.01)
    t0 = loop.time()
    await server.close(timeout_s=0.5)
    assert 0.4 < loop.time() - t0 < 5
    assert finished == ["/short"] and cancelled == ["/long"]
    await asyncio.wait_for(c.closed, 5)  # the connections are closed
    assert not os.path.exists(server.path)


async def test_a_frontends_accept_error_is_counted_in_the_primary(tmp_path: Path) -> None:
    """``[ACCEPT_ERROR, 0, errno]`` reaches ``on_accept_error`` (the serve process's
    ``servehall_accept_errors_total``), as a real monitor counts it."""
    import errno

    from servehall.server.accept_errors import AcceptErrorMonitor
    from servehall.server.bridge_wire import ACCEPT_ERROR

    monitor = AcceptErrorMonitor()
    server = BridgeServer(echo_app, str(tmp_path / "b.sock"), monitor.count)
    await server.start()
    try:
        c = await Bridge(server).connect()
        c.push((ACCEPT_ERROR, 0, errno.EMFILE))
        c.push((ACCEPT_ERROR, 0, errno.EMFILE))
        for _ in range(100):
            if monitor.total:
                break
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)
        assert monitor.total == {"EMFILE": 2}
    finally:
        await server.close(timeout_s=1.0)
