"""Tests of servehall.server.hypercorn.h1_early_response's decisions on real ``h11``
connections fed raw request bytes: how much of a body is unread, when an early answer
must say ``Connection: close``, the drain budget from the config, and that installing
the fix is idempotent. (The fix on a running Hypercorn is ``test_connections.py``.)"""

from __future__ import annotations

import h11
import pytest

from servehall.server.hypercorn import h1_early_response
from servehall.server.hypercorn import h1_early_response as early
from servehall.server.hypercorn.h1_early_response import (
    DEFAULT_DRAIN_BYTES,
    DEFAULT_DRAIN_S,
    DRAIN_BYTES_ATTR,
    DRAIN_S_ATTR,
    _budget,
    _says_close,
    must_close,
    unread_body_bytes,
)


def _server(raw: bytes) -> h11.Connection:
    """A server-side connection that has read ``raw`` up to the request head (and any
    body bytes in it)."""
    conn = h11.Connection(h11.SERVER)
    conn.receive_data(raw)
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA or isinstance(event, h11.EndOfMessage):
            return conn


HEAD = b"POST /v1/files HTTP/1.1\r\nHost: x\r\n"


def test_content_length_body_partly_read() -> None:
    conn = _server(HEAD + b"Content-Length: 100\r\n\r\n" + b"x" * 30)
    assert unread_body_bytes(conn) == 70
    assert must_close(conn, drain_bytes=70) is False  # fits the budget: drain, keep alive
    assert must_close(conn, drain_bytes=69) is True


def test_complete_body_never_forces_close() -> None:
    conn = _server(HEAD + b"Content-Length: 5\r\n\r\nhello")
    assert conn.their_state is h11.DONE
    assert unread_body_bytes(conn) == 0 and must_close(conn, 0) is False
    get = _server(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    assert unread_body_bytes(get) == 0 and must_close(get, 0) is False


def test_chunked_body_is_unknown() -> None:
    conn = _server(HEAD + b"Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n")
    assert unread_body_bytes(conn) is None
    assert must_close(conn, drain_bytes=10**12) is True


def test_a_client_waiting_for_100_continue_must_be_closed() -> None:
    conn = _server(HEAD + b"Content-Length: 10\r\nExpect: 100-continue\r\n\r\n")
    assert conn.they_are_waiting_for_100_continue
    assert must_close(conn, drain_bytes=10**9) is True


@pytest.mark.parametrize(
    ("headers", "close"),
    [
        ([(b"connection", b"close")], True),
        ([(b"Connection", b"Keep-Alive, Close")], True),
        ([(b"connection", b"keep-alive")], False),
        ([(b"content-type", b"close")], False),
        ([], False),
    ],
)
def test_says_close(headers: list[tuple[bytes, bytes]], close: bool) -> None:
    assert _says_close(headers) is close


def test_budget_from_config_or_defaults() -> None:
    class Config:
        pass

    assert _budget(Config()) == (DEFAULT_DRAIN_BYTES, DEFAULT_DRAIN_S)
    cfg = Config()
    setattr(cfg, DRAIN_BYTES_ATTR, "1024")
    setattr(cfg, DRAIN_S_ATTR, 2)
    assert _budget(cfg) == (1024, 2.0)


def test_install_is_idempotent() -> None:
    from hypercorn.protocol.h11 import H11Protocol

    early.install()
    patched = dict(vars(H11Protocol))
    early.install()
    assert dict(vars(H11Protocol)) == patched
    assert early._INSTALLED


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
