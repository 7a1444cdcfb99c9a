"""Tests of servehall.server.hypercorn.h2_refused_stream on a real Hypercorn
(``conn_server.py`` subprocesses, raw HTTP/2): a stream over ``MAX_CONCURRENT_STREAMS``
is refused alone with ``RST_STREAM(REFUSED_STREAM)`` and the connection stays usable;
the ``control`` test shows a bare Hypercorn dropping the connection. Moved unchanged
from test_connections.py."""

from __future__ import annotations

import socket
from collections.abc import Callable
from typing import Any

import h2.errors

from servehall.testing.rawhttp import H2Client

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


def test_h2_stream_over_limit_refused_alone(start: Callable[..., Any]) -> None:
    srv = start("--max-streams", "10")
    limit, statuses, resets, terminated, after = _h2_burst(srv.port, 1)
    assert limit == 10
    assert not terminated
    assert statuses.count(200) == 10
    assert resets == [h2.errors.ErrorCodes.REFUSED_STREAM]
    assert after == 200  # the connection stays usable


def test_h2_refused_stream_with_body_keeps_connection(start: Callable[..., Any]) -> None:
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


def test_control_bare_hypercorn_h2_drops_connection(start: Callable[..., Any]) -> None:
    srv = start("--max-streams", "10", fixes=False)
    _, statuses, _, terminated, _ = _h2_burst(srv.port, 1)
    assert terminated and statuses.count(200) < 10
