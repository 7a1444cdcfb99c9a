"""Tests of servehall.server.hypercorn.h2_incomplete_reset on a real Hypercorn
(``conn_server.py`` subprocesses, raw HTTP/2): a response the application leaves
unfinished (``/cut``: headers and two body messages, then the app returns) is reset with
``RST_STREAM(INTERNAL_ERROR)`` after the bytes already sent, and the connection serves
the next request; completed responses on the same connection are not touched. The
``control`` test shows a bare Hypercorn leaving the stream open."""

from __future__ import annotations

import socket
from collections.abc import Callable
from typing import Any

import h2.errors
import pytest

from servehall.testing.rawhttp import H2Client


def test_h2_unfinished_response_is_reset_and_the_connection_stays(
    start: Callable[..., Any],
) -> None:
    srv = start()
    with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as s:
        client = H2Client(s)
        client.read_settings()
        ok = client.request("GET", "/sse?3", flush=False)
        cut = client.request("GET", "/cut?2", flush=False)
        client.flush()
        assert client.wait([ok, cut])
        assert client.streams[cut].status == 200
        assert client.streams[cut].body == b"part 0\npart 1\n"  # what was sent arrives
        assert client.streams[cut].reset == h2.errors.ErrorCodes.INTERNAL_ERROR
        assert not client.streams[cut].ended
        assert client.streams[ok].ended and client.streams[ok].reset is None
        assert client.streams[ok].body == b"event 0\nevent 1\nevent 2\n"
        after = client.request("GET", "/ok")
        assert client.wait([after]) and client.streams[after].status == 200
        assert client.terminated is None


def test_h2_unfinished_response_control_stays_open(start: Callable[..., Any]) -> None:
    """Bare Hypercorn 0.18: the unfinished stream is neither ended nor reset — the
    client waits until its own timeout (here 2 s without a frame)."""
    srv = start(fixes=False)
    with socket.create_connection(("127.0.0.1", srv.port), timeout=2) as s:
        client = H2Client(s)
        client.read_settings()
        cut = client.request("GET", "/cut?1")
        with pytest.raises(TimeoutError):
            client.wait([cut])
        assert client.streams[cut].body == b"part 0\n"
        assert not client.streams[cut].ended and client.streams[cut].reset is None
