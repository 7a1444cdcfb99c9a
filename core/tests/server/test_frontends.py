"""Tests of servehall.server.frontends: ``"auto"``, the frontends' argument, and a real
:class:`FrontendPool` of ``python -m servehall.server.frontend`` processes sharing a
real listening socket in front of a real :class:`~servehall.server.bridge.BridgeServer`:
served requests, a SIGKILLed frontend started again (the other's stream untouched),
SIGTERM drains a stream in flight, a frontend that cannot reach the primary fails the
start."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from servehall.config.models import ServerSettings
from servehall.errors import ConfigError
from servehall.server import frontends
from servehall.server.bridge import BridgeServer
from servehall.server.frontends import FrontendPool, frontend_options, resolve_api_processes
from servehall.server.listeners import bind_sockets
from servehall.testing.sockets import free_port

Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


@pytest.mark.parametrize(
    ("value", "cpus", "want"),
    [
        ("auto", 1, 1),
        ("auto", 2, 1),
        ("auto", 7, 1),
        ("auto", 8, 2),
        ("auto", 16, 4),
        ("auto", 64, 8),
        ("auto", 256, 8),
        (1, None, 1),
        (3, None, 3),
        ("2", None, 2),
    ],
)
def test_resolve_api_processes(value: int | str, cpus: int | None, want: int) -> None:
    assert resolve_api_processes(value, cpus) == want


def test_resolve_auto_reads_this_machines_cpus() -> None:
    assert resolve_api_processes("auto") == max(1, min(8, len(os.sched_getaffinity(0)) // 4))


def test_api_processes_setting() -> None:
    assert ServerSettings().api_processes == 1
    assert ServerSettings(api_processes="auto").api_processes == "auto"
    for bad in (0, 65, "many"):
        with pytest.raises(ValueError):
            ServerSettings.model_validate({"api_processes": bad})


def test_frontend_options_leave_out_the_broadcast_url() -> None:
    server = ServerSettings.model_validate(
        {"bind": ["127.0.0.1:1"], "api_processes": 2, "config_broadcast_url": "redis://secret@h/0"}
    )
    options = json.loads(frontend_options(server, [7, 9], "/run/b.sock"))
    assert options["fds"] == [7, 9] and options["socket"] == "/run/b.sock"
    assert "config_broadcast_url" not in options["server"]
    assert "secret" not in json.dumps(options)
    ServerSettings.model_validate(options["server"])  # what the frontend reads back


async def app(scope: dict[str, Any], receive: Receive, send: Send) -> None:
    """``/slow?n=N``: N chunks 0.1 s apart; anything else: ``ok``."""
    if scope["type"] != "http":
        return
    await receive()
    await send({"type": "http.response.start", "status": 200, "headers": []})
    if scope["path"] == "/slow":
        for i in range(int(scope["query_string"].decode().split("=")[1])):
            await send({"type": "http.response.body", "body": b"%d\n" % i, "more_body": True})
            await asyncio.sleep(0.1)
    await send({"type": "http.response.body", "body": b"ok", "more_body": False})


class Pool:
    def __init__(self, pool: FrontendPool, bridge: BridgeServer, url: str) -> None:
        self.pool = pool
        self.bridge = bridge
        self.url = url
        self.restarts: list[int] = []


@pytest.fixture
async def pool(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Pool]:
    """Two frontends on one listening socket, connected to a bridge serving :func:`app`."""
    monkeypatch.setattr(frontends, "RESTART_BACKOFF_S", (0.1, 0.2))
    port = free_port()
    sockets = bind_sockets([f"127.0.0.1:{port}"])
    sockets[0].listen(100)  # as serve_frontends does before starting them
    bridge = BridgeServer(app, str(tmp_path / "bridge.sock"))
    await bridge.start()
    server = ServerSettings(bind=[f"127.0.0.1:{port}"], graceful_timeout_s=5, log_level="warning")
    p = Pool(
        FrontendPool(2, server, [[s.fileno() for s in sockets]] * 2, bridge.path, None),
        bridge,
        f"http://127.0.0.1:{port}",
    )
    p.pool.on_restart = p.restarts.append
    await p.pool.start(bridge.wait_connections)
    yield p
    await p.pool.drain(5)
    await bridge.close(1)
    for s in sockets:
        s.close()


def _served_by(pids: list[int], client_port: int) -> int:
    """Which of ``pids`` holds the server end of the connection from ``client_port``."""
    import psutil

    for pid in pids:
        for c in psutil.Process(pid).net_connections("tcp"):
            if c.raddr and c.raddr.port == client_port:
                return pid
    raise AssertionError(f"no frontend holds the connection from port {client_port}")


async def _stream_on(url: str, n: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, int]:
    """An HTTP/1.1 ``/slow`` request, read to its first chunk: (reader, writer, local port)."""
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(f"GET /slow?n={n} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    got = b""
    while b"0\n" not in got:
        chunk = await asyncio.wait_for(reader.read(4096), 10)
        assert chunk
        got += chunk
    return reader, writer, writer.get_extra_info("sockname")[1]


async def _read_all(reader: asyncio.StreamReader) -> bytes:
    got = b""
    while not got.endswith(b"0\r\n\r\n"):  # the chunked body's end
        chunk = await asyncio.wait_for(reader.read(4096), 20)
        if not chunk:
            break
        got += chunk
    return got


async def test_two_frontends_serve_one_socket(pool: Pool) -> None:
    assert len(pool.pool.pids) == 2 and os.getpid() not in pool.pool.pids
    assert len(pool.bridge.connections) == 2
    seen: set[int] = set()
    for _ in range(40):  # separate connections, until both frontends have taken one
        async with (
            httpx.AsyncClient(http2=True, http1=False, timeout=10) as c,
            c.stream("GET", pool.url + "/slow?n=1") as r,
        ):
            port = r.extensions["network_stream"].get_extra_info("client_addr")[1]
            seen.add(_served_by(pool.pool.pids, port))
            assert (await r.aread()) == b"0\nok"
        if len(seen) == 2:
            break
    assert seen == set(pool.pool.pids)


async def test_a_killed_frontend_is_started_again_and_the_other_stream_finishes(
    pool: Pool,
) -> None:
    # one stream on each frontend
    streams: dict[int, tuple[asyncio.StreamReader, asyncio.StreamWriter]] = {}
    others: list[asyncio.StreamWriter] = []
    for _ in range(40):
        reader, writer, port = await _stream_on(pool.url, 20)
        pid = _served_by(pool.pool.pids, port)
        if pid in streams:
            others.append(writer)
        else:
            streams[pid] = (reader, writer)
        if len(streams) == 2:
            break
    assert len(streams) == 2
    victim, survivor = list(streams)
    before = list(pool.pool.pids)
    os.kill(victim, signal.SIGKILL)
    cut = await asyncio.wait_for(streams[victim][0].read(), 10)  # the connection closes
    assert not cut.endswith(b"0\r\n\r\n")
    body = await _read_all(streams[survivor][0])
    assert body.endswith(b"ok\r\n0\r\n\r\n") and b"19\n" in body
    for _ in range(200):
        if pool.restarts and len(pool.bridge.connections) == 2:
            break
        await asyncio.sleep(0.05)
    assert pool.restarts == [before.index(victim)]
    assert len(pool.pool.pids) == 2 and survivor in pool.pool.pids
    assert victim not in pool.pool.pids
    async with httpx.AsyncClient(http2=True, http1=False, timeout=10) as c:
        assert (await c.get(pool.url + "/")).text == "ok"
    for _, w in streams.values():
        w.close()
    for w in others:
        w.close()


async def test_drain_finishes_the_stream_in_flight(pool: Pool) -> None:
    procs = [p for p in pool.pool.procs if p is not None]
    reader, writer, _ = await _stream_on(pool.url, 10)  # ~1 s
    draining = asyncio.create_task(pool.pool.drain(10))
    body = await _read_all(reader)
    assert body.endswith(b"ok\r\n0\r\n\r\n") and b"9\n" in body
    await asyncio.wait_for(draining, 15)
    assert [p.returncode for p in procs] == [0, 0]
    assert pool.pool.pids == []
    writer.close()
    # no new connections: the listening socket is still open in this process (its
    # backlog takes the connect) but nobody accepts
    with pytest.raises(httpx.ReadTimeout):
        httpx.get(pool.url + "/", timeout=0.5)


async def test_a_frontend_that_cannot_reach_the_primary_fails_the_start(tmp_path: Path) -> None:
    port = free_port()
    sockets = bind_sockets([f"127.0.0.1:{port}"])
    bridge = BridgeServer(app, str(tmp_path / "never-started.sock"))
    try:
        server = ServerSettings(bind=[f"127.0.0.1:{port}"], log_level="error")
        pool = FrontendPool(1, server, [[s.fileno() for s in sockets]], bridge.path)
        with pytest.raises(ConfigError, match="an API process exited during startup"):
            await pool.start(bridge.wait_connections)
        assert pool.pids == []
    finally:
        for s in sockets:
            s.close()


async def test_serve_frontends_takes_connections_from_the_start_and_stops(
    tmp_path: Path,
) -> None:
    """A connection made before the frontends are up waits in the backlog and is served;
    ``stop`` drains them and closes the sockets."""
    from servehall.server.frontends import serve_frontends

    port = free_port()
    binds = [f"127.0.0.1:{port}"]
    server = ServerSettings(bind=binds, graceful_timeout_s=5, log_level="warning")
    stop = asyncio.Event()
    task = asyncio.create_task(serve_frontends(app, server, binds, 2, stop))
    for _ in range(100):  # listening before the frontends have started
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            break
        except OSError:
            await asyncio.sleep(0.01)
    else:
        raise AssertionError("connections refused while the frontends start")
    writer.write(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    answer = await asyncio.wait_for(reader.read(), 60)
    assert answer.startswith(b"HTTP/1.1 200") and b"\r\nok\r\n" in answer, answer
    writer.close()
    stop.set()
    await asyncio.wait_for(task, 30)
    with pytest.raises(OSError):
        await asyncio.open_connection("127.0.0.1", port)


def test_listening_groups_give_each_frontend_its_own_reuse_port_socket() -> None:
    """With ``SO_REUSEPORT`` each frontend gets its own listening socket on the same
    address, all listening, and the kernel spreads a burst of connections over them (a
    shared socket gave one frontend a whole burst)."""
    from servehall.server.frontends import listening_groups
    from servehall.server.listeners import can_reuse_port

    if not can_reuse_port():
        pytest.skip("SO_REUSEPORT balancing is Linux's")
    first = bind_sockets(["127.0.0.1:0"], reuse_port=True)
    groups = listening_groups(first, 2, 128)
    try:
        assert groups[0] == first and groups[1][0] is not first[0]
        port = first[0].getsockname()[1]
        assert groups[1][0].getsockname() == ("127.0.0.1", port)
        clients = [socket.create_connection(("127.0.0.1", port)) for _ in range(32)]
        accepted = []
        for g in groups:
            g[0].setblocking(False)
            n = 0
            with contextlib.suppress(BlockingIOError):
                while True:
                    g[0].accept()[0].close()
                    n += 1
            accepted.append(n)
        for c in clients:
            c.close()
        assert sum(accepted) == 32 and min(accepted) > 0, accepted
    finally:
        for g in groups:
            for sock in g:
                sock.close()


def test_listening_groups_share_sockets_bound_without_reuse_port() -> None:
    from servehall.server.frontends import listening_groups

    sockets = bind_sockets(["127.0.0.1:0"])
    try:
        groups = listening_groups(sockets, 3, 16)
        assert groups == [sockets] * 3
        socket.create_connection(sockets[0].getsockname()).close()  # listening
    finally:
        sockets[0].close()
