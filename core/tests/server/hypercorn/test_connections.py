"""Connection handling on a real Hypercorn, with and without servehall's fixes
(:mod:`servehall.server.hypercorn`): closed connections released at once, early HTTP/1.1
answers, refused HTTP/2 streams. Raw sockets only; socket states come from the kernel
(``/proc/net/tcp``). Each bug is also shown on a bare Hypercorn (the ``control`` tests),
so these tests can tell a fixed server from an unfixed one.

The servers are subprocesses running ``conn_server.py`` (a tiny ASGI app).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import h2.errors
import h11
import httpx
import pytest

from servehall.server.hypercorn import h1_early_response
from servehall.testing.rawhttp import H2Client, read_response, read_until_closed
from servehall.testing.sockets import free_port, server_socket_states, wait_for_states

SERVER = Path(__file__).with_name("conn_server.py")


class Server:
    def __init__(self, proc: subprocess.Popen[bytes], port: int) -> None:
        self.proc = proc
        self.port = port

    def stop(self, timeout: float = 40.0) -> float:
        """SIGTERM; returns the seconds the process took to exit."""
        t0 = time.monotonic()
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        return time.monotonic() - t0


@pytest.fixture
def start() -> Iterator[Callable[..., Server]]:
    servers: list[Server] = []

    def factory(*args: str, fixes: bool = True) -> Server:
        port = free_port()
        cmd = [sys.executable, str(SERVER), str(port), *(["--fixes"] if fixes else []), *args]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        srv = Server(proc, port)
        servers.append(srv)
        assert proc.stdout is not None
        if proc.stdout.readline().strip() != b"ready":
            raise RuntimeError("conn_server.py did not start")
        return srv

    yield factory
    for srv in servers:
        srv.stop(5)


# --- raw HTTP/1.1 ---------------------------------------------------------------------


def get_ok(sock: socket.socket, buf: bytearray) -> int:
    sock.sendall(b"GET /ok HTTP/1.1\r\nHost: x\r\n\r\n")
    return read_response(sock, buf)[0]


# --- N29: closed connections are released ---------------------------------------------


def _churn_h1(port: int, n: int) -> None:
    for _ in range(n):
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            assert get_ok(s, bytearray()) == 200


def _h2_get(port: int) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        client = H2Client(s)
        sid = client.request("GET", "/ok")
        assert client.wait([sid]) and client.streams[sid].status == 200


def test_closed_connections_released_at_once(start: Callable[..., Server]) -> None:
    srv = start()
    _churn_h1(srv.port, 40)
    for _ in range(40):
        _h2_get(srv.port)
    # the target is 1 s; the bound here is generous for a loaded CI machine
    ok, states = wait_for_states(
        srv.port, lambda s: s["CLOSE-WAIT"] == 0 and s["ESTABLISHED"] == 0, timeout=10
    )
    assert ok, states


def test_control_bare_hypercorn_keeps_close_wait(start: Callable[..., Server]) -> None:
    srv = start(fixes=False)
    _churn_h1(srv.port, 5)
    time.sleep(1.5)
    assert server_socket_states(srv.port)["CLOSE-WAIT"] == 5


def test_open_idle_connection_is_kept(start: Callable[..., Server]) -> None:
    """The fix ends connections on EOF only: an idle keep-alive connection stays usable."""
    srv = start()
    with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as s:
        buf = bytearray()
        assert get_ok(s, buf) == 200
        time.sleep(1.0)
        assert get_ok(s, buf) == 200


# --- N27: early answers on HTTP/1.1 -----------------------------------------------------


def _early_then_second(port: int, path: str = "/early") -> tuple[int, dict[str, str], int | str]:
    body = b"x" * 80
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(
            f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain\r\n"
            f"Content-Length: {len(body)}\r\n\r\n".encode()
        )
        time.sleep(0.01)
        buf = bytearray()
        status, headers, _ = read_response(s, buf)
        with contextlib.suppress(OSError):
            s.sendall(body)
        try:
            second: int | str = get_ok(s, buf)
        except OSError as exc:
            second = type(exc).__name__
        return status, headers, second


def test_early_answer_reads_and_drops_small_body(start: Callable[..., Server]) -> None:
    srv = start()
    status, headers, second = _early_then_second(srv.port)
    assert status == 415
    assert "close" not in headers.get("connection", "")
    assert second == 200  # the same connection served the next request


def test_control_bare_hypercorn_closes_silently(start: Callable[..., Server]) -> None:
    srv = start(fixes=False)
    status, headers, second = _early_then_second(srv.port)
    assert status == 415 and "close" not in headers.get("connection", "")
    assert second != 200


def test_early_answer_over_budget_says_close_and_closes(start: Callable[..., Server]) -> None:
    """Unread body larger than the drain budget: ``Connection: close``, then the server
    still reads (up to the budget) and closes."""
    srv = start("--drain-bytes", "100000")
    with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as s:
        s.sendall(
            b"POST /early HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain\r\n"
            b"Content-Length: 10000000\r\n\r\n"
        )
        status, headers, _ = read_response(s, bytearray())
        assert status == 415 and headers["connection"] == "close"
        assert read_until_closed(s, timeout=30)
    ok, states = wait_for_states(srv.port, lambda st: st["ESTABLISHED"] == 0, timeout=10)
    assert ok, states


def test_early_answer_chunked_says_close(start: Callable[..., Server]) -> None:
    srv = start()
    with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as s:
        s.sendall(
            b"POST /early HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n"
        )
        status, headers, _ = read_response(s, bytearray())
        assert status == 415 and headers["connection"] == "close"
        s.sendall(b"5\r\nhello\r\n0\r\n\r\n")  # the body ends: the server closes
        assert read_until_closed(s, timeout=30)


def test_body_read_normally_keeps_alive(start: Callable[..., Server]) -> None:
    srv = start()
    with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as s:
        buf = bytearray()
        for _ in range(3):
            s.sendall(b"POST /read HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello")
            status, headers, body = read_response(s, buf)
            assert (status, body) == (200, b"5") and "connection" not in headers


# --- N28 and issue 16 item 5: 413 + Connection: close on a body sent at full speed ----------


def _send_big(port: int, size: int) -> tuple[int, dict[str, str], bool, str]:
    """POST ``size`` bytes to /early-close at full speed from a thread while reading."""
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    errors: list[str] = []

    def writer() -> None:
        try:
            s.sendall(
                f"POST /early-close?slow HTTP/1.1\r\nHost: x\r\n"
                f"Content-Type: application/json\r\nContent-Length: {size}\r\n\r\n".encode()
            )
            chunk = b"x" * 65536
            for _ in range(size // len(chunk)):
                s.sendall(chunk)
        except OSError as exc:
            errors.append(type(exc).__name__)

    t = threading.Thread(target=writer, daemon=True)
    t.start()
    try:
        status, headers, _ = read_response(s, bytearray())
        closed = read_until_closed(s, timeout=20)
    finally:
        t.join(30)
        s.close()
    return status, headers, closed, ",".join(errors)


def test_413_full_speed_body_is_answered_and_closed(start: Callable[..., Server]) -> None:
    srv = start()
    status, headers, closed, _ = _send_big(srv.port, 20_000_000)
    assert status == 413 and headers["connection"] == "close"
    assert closed  # the server closed the connection after the 413
    ok, states = wait_for_states(srv.port, lambda st: st["ESTABLISHED"] == 0, timeout=10)
    assert ok, states
    assert srv.stop() < 20  # shutdown is not held by the connection (graceful = 30 s)
    assert srv.proc.returncode == 0


def test_control_bare_hypercorn_413_deadlocks(start: Callable[..., Server]) -> None:
    srv = start(fixes=False)
    s = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
    s.sendall(
        b"POST /early-close?slow HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: 20000000\r\n\r\n"
    )
    s.setblocking(False)
    with contextlib.suppress(BlockingIOError):
        for _ in range(400):
            s.send(b"x" * 65536)
    time.sleep(2.0)
    states = server_socket_states(srv.port)
    s.close()
    assert states["ESTABLISHED"] == 1  # stuck: neither read nor closed


async def _httpx_post(port: int, size: int, path: str = "/early-close") -> int:
    async with httpx.AsyncClient(http1=True, http2=False, timeout=60) as c:
        r = await c.post(
            f"http://127.0.0.1:{port}{path}",
            content=b"x" * size,
            headers={"content-type": "application/json"},
        )
        return r.status_code


def test_async_httpx_h1_sees_the_413(start: Callable[..., Server]) -> None:
    """A client that writes its whole body before reading (httpx async, HTTP/1.1)."""
    srv = start()
    assert [asyncio.run(_httpx_post(srv.port, 5_000_000)) for _ in range(5)] == [413] * 5
    assert asyncio.run(_httpx_post(srv.port, 5_000_000, "/early-close?slow")) == 413
    assert asyncio.run(_httpx_post(srv.port, 5_000_000, "/early")) == 415


def test_control_bare_hypercorn_async_httpx_misses_the_413(start: Callable[..., Server]) -> None:
    srv = start(fixes=False)
    results = []
    for _ in range(3):
        try:
            results.append(asyncio.run(_httpx_post(srv.port, 5_000_000)))
        except httpx.HTTPError as exc:
            results.append(type(exc).__name__)
    assert any(r != 413 for r in results), results  # (5 of 5 in issue 16)


# --- N11: HTTP/2 stream over MAX_CONCURRENT_STREAMS ------------------------------------------


def _h2_burst(port: int, extra: int) -> tuple[int, list[int], list[int], bool, int]:
    """Open ``extra`` more streams than the server allows, in one write. Returns the
    server's limit, the statuses of the streams, the error codes of reset streams, whether
    the connection ended, and the status of one more request afterwards."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        client = H2Client(s)
        limit = client.read_settings()
        client.allow_streams(limit + extra)
        sids = [client.request("GET", "/ok", flush=False) for _ in range(limit + extra)]
        client.flush()
        alive = client.wait(sids)
        after = 0
        if alive:
            sid = client.request("GET", "/ok")
            if client.wait([sid]):
                after = client.streams[sid].status
        streams = [client.streams[i] for i in sids]
        resets = [st.reset for st in streams if st.reset is not None]
        return limit, [st.status for st in streams], resets, not alive, after


def test_h2_stream_over_limit_refused_alone(start: Callable[..., Server]) -> None:
    srv = start("--max-streams", "10")
    limit, statuses, resets, terminated, after = _h2_burst(srv.port, 1)
    assert limit == 10
    assert not terminated
    assert statuses.count(200) == 10
    assert resets == [h2.errors.ErrorCodes.REFUSED_STREAM]
    assert after == 200  # the connection stays usable


def test_h2_refused_stream_with_body_keeps_connection(start: Callable[..., Server]) -> None:
    """The refused stream carries DATA frames too: they are answered as a stream error
    (flow control stays right), not a connection error."""
    srv = start("--max-streams", "4")
    with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as s:
        client = H2Client(s)
        limit = client.read_settings()
        client.allow_streams(limit + 1)
        sids = [client.request("GET", "/ok", flush=False) for _ in range(limit)]
        extra = client.request("POST", "/read", body=b"x" * 40_000, flush=False)
        client.flush()
        assert client.wait([*sids, extra]), client.terminated
        assert [client.streams[i].status for i in sids] == [200] * limit
        assert client.streams[extra].reset == h2.errors.ErrorCodes.REFUSED_STREAM
        for _ in range(3):  # the connection, its HPACK state and its window still work
            sid = client.request("POST", "/read", body=b"y" * 40_000)
            assert client.wait([sid]) and client.streams[sid].body == b"40000"


def test_control_bare_hypercorn_h2_drops_connection(start: Callable[..., Server]) -> None:
    srv = start("--max-streams", "10", fixes=False)
    _, statuses, _, terminated, _ = _h2_burst(srv.port, 1)
    assert terminated and statuses.count(200) < 10


# --- the decision helpers ----------------------------------------------------------------


def _server_reading(request: bytes) -> h11.Connection:
    conn = h11.Connection(h11.SERVER)
    conn.receive_data(request)
    assert isinstance(conn.next_event(), h11.Request)
    return conn


def test_unread_body_bytes_and_must_close() -> None:
    conn = _server_reading(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n")
    assert h1_early_response.unread_body_bytes(conn) == 100
    assert not h1_early_response.must_close(conn, 100)
    assert h1_early_response.must_close(conn, 99)
    conn.receive_data(b"x" * 60)
    assert isinstance(conn.next_event(), h11.Data)
    assert h1_early_response.unread_body_bytes(conn) == 40
    chunked = _server_reading(b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
    assert h1_early_response.unread_body_bytes(chunked) is None
    assert h1_early_response.must_close(chunked, 10**9)
    expect = _server_reading(
        b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n"
    )
    assert h1_early_response.must_close(expect, 10**9)
    done = _server_reading(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    assert isinstance(done.next_event(), h11.EndOfMessage)
    assert h1_early_response.unread_body_bytes(done) == 0
    assert not h1_early_response.must_close(done, 0)
