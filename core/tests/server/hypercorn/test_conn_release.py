"""Tests of servehall.server.hypercorn.conn_release on a real Hypercorn
(``conn_server.py`` subprocesses, raw sockets, socket states from ``/proc/net/tcp``): a
connection the client closed is released at once (no ``CLOSE-WAIT``), an idle open one
is kept; the ``control`` test shows the bug on a bare Hypercorn. Moved unchanged from
test_connections.py."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from typing import Any

from servehall.testing.rawhttp import H2Client, read_response
from servehall.testing.sockets import server_socket_states, wait_for_states


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


def test_closed_connections_released_at_once(start: Callable[..., Any]) -> None:
    srv = start()
    _churn_h1(srv.port, 40)
    for _ in range(40):
        _h2_get(srv.port)
    # the target is 1 s; the bound here is generous for a loaded CI machine
    ok, states = wait_for_states(
        srv.port, lambda s: s["CLOSE-WAIT"] == 0 and s["ESTABLISHED"] == 0, timeout=10
    )
    assert ok, states


def test_control_bare_hypercorn_keeps_close_wait(start: Callable[..., Any]) -> None:
    srv = start(fixes=False)
    _churn_h1(srv.port, 5)
    time.sleep(1.5)
    assert server_socket_states(srv.port)["CLOSE-WAIT"] == 5


def test_open_idle_connection_is_kept(start: Callable[..., Any]) -> None:
    """The fix ends connections on EOF only: an idle keep-alive connection stays usable."""
    srv = start()
    with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as s:
        buf = bytearray()
        assert get_ok(s, buf) == 200
        time.sleep(1.0)
        assert get_ok(s, buf) == 200
