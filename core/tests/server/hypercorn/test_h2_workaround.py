"""Tests of servehall.server.hypercorn.h2_workaround on a real Hypercorn
(``conn_server.py`` subprocesses, raw HTTP/2): DATA frames that arrive for a stream the
server already answered (an early 415) are acknowledged and dropped, and the connection
serves the next request; the ``control`` test shows a bare Hypercorn dropping it."""

from __future__ import annotations

import socket
from collections.abc import Callable
from typing import Any

from servehall.server.hypercorn import h2_workaround
from servehall.testing.rawhttp import H2Client, H2Stream


def _early_then_data(port: int) -> tuple[int, bool, int]:
    """POST /early with its body sent only after the early answer came. Returns that
    answer's status, whether the connection survived the late DATA frames, and the status
    of a request on the same connection afterwards (0: none)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        client = H2Client(s)
        client.read_settings()
        sid = client.conn.get_next_available_stream_id()
        hdrs = [(":method", "POST"), (":path", "/early"), (":scheme", "http"), (":authority", "x")]
        client.conn.send_headers(sid, hdrs, end_stream=False)
        client.streams[sid] = H2Stream()
        client.flush()
        assert client.wait([sid])
        status = client.streams[sid].status
        for _ in range(4):  # late body: the server removed the stream already
            client.conn.send_data(sid, b"x" * 8_000)
        client.conn.send_data(sid, b"", end_stream=True)
        client.flush()
        after = client.request("GET", "/ok")
        alive = client.wait([after])
        return status, alive, client.streams[after].status if alive else 0


def test_late_data_for_an_answered_stream_keeps_the_connection(
    start: Callable[..., Any],
) -> None:
    srv = start()
    assert _early_then_data(srv.port) == (415, True, 200)


def test_control_bare_hypercorn_drops_the_connection(start: Callable[..., Any]) -> None:
    srv = start(fixes=False)
    status, alive, _ = _early_then_data(srv.port)
    assert status == 415 and not alive


def test_install_is_idempotent() -> None:
    from hypercorn.protocol.h2 import H2Protocol

    h2_workaround.install()
    patched = H2Protocol._handle_events
    h2_workaround.install()
    assert H2Protocol._handle_events is patched  # not wrapped twice
    assert patched.__module__ == h2_workaround.__name__
