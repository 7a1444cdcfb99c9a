"""HTTP/2 response headers in one pass (:mod:`servehall.server.hypercorn.h2_headers`): the
normal-form check against h2's own pipeline, and real h2 connections (server patched,
client h2's own) exchanging responses — the client must decode exactly the headers the
server sent, and the request id must stay out of the server's HPACK table."""

from __future__ import annotations

import uuid
from typing import Any

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import pytest
from h2.utilities import (
    HeaderValidationFlags,
    normalize_outbound_headers,
    validate_outbound_headers,
)
from hpack import Decoder, Encoder, HeaderTuple, NeverIndexedHeaderTuple

from servehall.server.hypercorn import h2_headers
from servehall.server.hypercorn.h2_headers import already_normal, encode_response
from servehall.testing.rawhttp import h2_connection_pair

RESPONSE = HeaderValidationFlags(
    is_client=False, is_trailer=False, is_response_header=True, is_push_promise=False
)

NORMAL: list[list[Any]] = [
    [(b":status", b"200")],
    [
        (b":status", b"200"),
        (b"content-type", b"text/event-stream; charset=utf-8"),
        (b"cache-control", b"no-cache"),
        (b"x-accel-buffering", b"no"),
        (b"x-request-id", b"chatcmpl-" + uuid.uuid4().hex.encode()),
        (b"date", b"Sun, 06 Dec 2026 00:00:00 GMT"),
    ],
    [(b":status", b"404"), (b"x-1", b""), (b"set-cookie", b"a=b")],
]

NOT_NORMAL: list[list[Any]] = [
    [],
    [(b"content-type", b"x")],  # no :status first
    [(b":status", b"200"), (b":path", b"/")],  # a request pseudo-header
    [(b":status", b"200"), (b":status", b"200")],  # duplicate
    [(b":status", b"200"), (b"Content-Type", b"x")],  # upper case
    [(b":status", b"200"), (b"x-a", b" padded ")],  # whitespace
    [(b":status", b"200"), (b" x-a", b"v")],
    [(b":status", b"200"), (b"connection", b"close")],
    [(b":status", b"200"), (b"transfer-encoding", b"chunked")],
    [(b":status", b"200"), (b"te", b"gzip")],
    [(b":status", b"200"), (b"authorization", b"secret")],
    [(b":status", b"200"), (b"cookie", b"short")],
    [(b":status", b"200"), HeaderTuple(b"x-a", b"v")],
    [(b":status", b"200"), NeverIndexedHeaderTuple(b"x-a", b"v")],
    [(b":status", b"200"), (b"1-2", b"v")],  # no cased letter: not known, h2 decides
]


def h2_pipeline(headers: list[Any]) -> list[Any]:
    """h2's own outbound normalisation + validation of a response block."""
    return list(validate_outbound_headers(normalize_outbound_headers(headers, RESPONSE), RESPONSE))


@pytest.mark.parametrize("headers", NORMAL)
def test_a_normal_block_is_what_h2s_pipeline_returns_unchanged(headers: list[Any]) -> None:
    assert already_normal(headers)
    out = h2_pipeline(headers)
    assert out == headers
    assert [type(h) for h in out] == [tuple] * len(headers)


@pytest.mark.parametrize("headers", NOT_NORMAL)
def test_any_other_block_is_left_to_h2(headers: list[Any]) -> None:
    assert not already_normal(headers)


def test_encoding_decodes_to_the_same_headers_and_keeps_ids_out_of_the_table() -> None:
    ours, theirs = Encoder(), Encoder()
    dec_ours, dec_theirs = Decoder(), Decoder()
    ours.header_table_size = theirs.header_table_size = 4096
    for i in range(200):
        headers = [
            (b":status", b"200"),
            (b"content-type", b"application/json"),
            (b"x-request-id", b"chatcmpl-" + uuid.uuid4().hex.encode()),
            (b"date", b"Sun, 06 Dec 2026 00:00:%02d GMT" % (i // 20)),
        ]
        got = dec_ours.decode(encode_response(ours, headers), raw=True)
        assert got == headers == dec_theirs.decode(theirs.encode(headers), raw=True)
    names = {name for name, _ in ours.header_table.dynamic_entries}
    assert b"x-request-id" not in names
    assert {b"content-type", b"date"} <= names


def pair() -> tuple[h2.connection.H2Connection, h2.connection.H2Connection]:
    """A client and a server connection (server patched), settings exchanged."""
    h2_headers.install()
    client, server = h2_connection_pair()
    return client, server


def exchange(
    client: h2.connection.H2Connection, server: h2.connection.H2Connection, headers: list[Any]
) -> list[Any]:
    """One request from ``client``, ``headers`` as the server's response; returns the
    response headers the client decoded."""
    sid = client.get_next_available_stream_id()
    client.send_headers(
        sid,
        [(":method", "GET"), (":path", "/"), (":scheme", "http"), (":authority", "x")],
        end_stream=True,
    )
    server.receive_data(client.data_to_send())
    server.send_headers(sid, headers, end_stream=True)
    events = client.receive_data(server.data_to_send())
    (got,) = [e for e in events if isinstance(e, h2.events.ResponseReceived)]
    return list(got.headers)


def test_a_real_connection_decodes_every_response_as_sent() -> None:
    client, server = pair()
    for _ in range(300):
        headers = [
            (b":status", b"200"),
            (b"content-type", b"text/event-stream; charset=utf-8"),
            (b"x-request-id", b"chatcmpl-" + uuid.uuid4().hex.encode()),
        ]
        assert exchange(client, server, headers) == headers
    names = {name for name, _ in server.encoder.header_table.dynamic_entries}
    assert b"x-request-id" not in names


def test_blocks_h2_changes_or_refuses_still_are() -> None:
    client, server = pair()
    got = exchange(
        client,
        server,
        [(b":status", b"200"), (b"X-Upper", b" v "), (b"connection", b"close")],
    )
    assert got == [(b":status", b"200"), (b"x-upper", b"v")]
    with pytest.raises(h2.exceptions.ProtocolError):
        exchange(client, server, [(b":status", b"200"), (b"te", b"gzip")])
    client, server = pair()
    with pytest.raises(h2.exceptions.ProtocolError):
        exchange(client, server, [(b"x-a", b"v")])  # no :status
