"""Early HTTP/1.1 answers on a real Hypercorn, with and without servehall's fixes
(:mod:`servehall.server.hypercorn.h1_early_response`; closed connections released at
once are in test_conn_release.py, refused HTTP/2 streams in test_h2_refused_stream.py).
Raw sockets only; socket states come from the kernel (``/proc/net/tcp``). Each bug is
also shown on a bare Hypercorn (the ``control`` tests), so these tests can tell a fixed
server from an unfixed one.

The servers are subprocesses running ``conn_server.py`` (a tiny ASGI app).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import httpx

from servehall.testing.rawhttp import read_response, read_until_closed
from servehall.testing.sockets import server_socket_states, wait_for_states

# --- raw HTTP/1.1 ---------------------------------------------------------------------


def get_ok(sock: socket.socket, buf: bytearray) -> int:
    sock.sendall(b"GET /ok HTTP/1.1\r\nHost: x\r\n\r\n")
    return read_response(sock, buf)[0]


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


def test_early_answer_reads_and_drops_small_body(start: Callable[..., Any]) -> None:
    srv = start()
    status, headers, second = _early_then_second(srv.port)
    assert status == 415
    assert "close" not in headers.get("connection", "")
    assert second == 200  # the same connection served the next request


def test_control_bare_hypercorn_closes_silently(start: Callable[..., Any]) -> None:
    srv = start(fixes=False)
    status, headers, second = _early_then_second(srv.port)
    assert status == 415 and "close" not in headers.get("connection", "")
    assert second != 200


def test_early_answer_over_budget_says_close_and_closes(start: Callable[..., Any]) -> None:
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


def test_early_answer_chunked_says_close(start: Callable[..., Any]) -> None:
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


def test_body_read_normally_keeps_alive(start: Callable[..., Any]) -> None:
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


def test_413_full_speed_body_is_answered_and_closed(start: Callable[..., Any]) -> None:
    srv = start()
    status, headers, closed, _ = _send_big(srv.port, 20_000_000)
    assert status == 413 and headers["connection"] == "close"
    assert closed  # the server closed the connection after the 413
    ok, states = wait_for_states(srv.port, lambda st: st["ESTABLISHED"] == 0, timeout=10)
    assert ok, states
    assert srv.stop() < 20  # shutdown is not held by the connection (graceful = 30 s)
    assert srv.proc.returncode == 0


def test_control_bare_hypercorn_413_deadlocks(start: Callable[..., Any]) -> None:
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


def test_async_httpx_h1_sees_the_413(start: Callable[..., Any]) -> None:
    """A client that writes its whole body before reading (httpx async, HTTP/1.1)."""
    srv = start()
    assert [asyncio.run(_httpx_post(srv.port, 5_000_000)) for _ in range(5)] == [413] * 5
    assert asyncio.run(_httpx_post(srv.port, 5_000_000, "/early-close?slow")) == 413
    assert asyncio.run(_httpx_post(srv.port, 5_000_000, "/early")) == 415


def test_control_bare_hypercorn_async_httpx_misses_the_413(start: Callable[..., Any]) -> None:
    srv = start(fixes=False)
    results = []
    for _ in range(3):
        try:
            results.append(asyncio.run(_httpx_post(srv.port, 5_000_000)))
        except httpx.HTTPError as exc:
            results.append(type(exc).__name__)
    assert any(r != 413 for r in results), results  # (5 of 5 in issue 16)
