"""HTTP/2 body data framed at once (:mod:`servehall.server.hypercorn.h2_direct_data`) on a
real Hypercorn (``conn_server.py --fixes``): small events on many streams, bodies larger
than the flow-control window (the buffered path, then the direct one again), and a stream
reset while its siblings stream — every byte arrives, in order, on a connection that
stays usable; and :func:`~servehall.server.hypercorn.h2_direct_data.frame_data` against h2's
own ``send_data``."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.settings
import pytest

from servehall.server.hypercorn.h2_direct_data import frame_data
from servehall.testing.rawhttp import H2Client, h2_connection_pair

SERVER = Path(__file__).with_name("conn_server.py")


def events(n: int) -> bytes:
    return b"".join(b"event %d\n" % i for i in range(n))


def test_events_on_many_streams_arrive_whole_and_in_order(port: int) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=20) as s:
        client = H2Client(s)
        client.read_settings()
        sids = [client.request("GET", "/sse?40", flush=False) for _ in range(48)]
        client.flush()
        assert client.wait(sids), client.terminated
        assert all(client.streams[sid].body == events(40) for sid in sids)
        sid = client.request("GET", "/ok")
        assert client.wait([sid]) and client.streams[sid].status == 200


def test_bodies_past_the_window_are_buffered_then_sent_in_order(port: int) -> None:
    """A 20,000-byte stream window: the first 8 KiB messages fit and leave at once, the
    next wait in the buffer for the client's WINDOW_UPDATE; nothing is lost or
    reordered, alone or next to event streams."""
    with socket.create_connection(("127.0.0.1", port), timeout=20) as s:
        client = H2Client(s)
        client.read_settings()
        client.conn.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 20_000})
        client.flush()
        big = [client.request("GET", "/big?100000", flush=False) for _ in range(3)]
        sse = [client.request("GET", "/sse?30", flush=False) for _ in range(8)]
        client.flush()
        assert client.wait(big + sse), client.terminated
        want = b"0123456789" * 10_000
        assert all(client.streams[sid].body == want for sid in big)
        assert all(client.streams[sid].body == events(30) for sid in sse)


def test_a_body_past_the_flush_mark_is_flushed_on_the_way(port: int) -> None:
    """Windows wide enough for the whole body: every 8 KiB message is framed directly,
    in one loop turn, so the framed bytes pass FLUSH_AT and are flushed as they go."""
    with socket.create_connection(("127.0.0.1", port), timeout=20) as s:
        client = H2Client(s)
        client.read_settings()
        client.conn.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 2**20})
        client.conn.increment_flow_control_window(2**22)
        client.flush()
        sids = [client.request("GET", "/big?400000", flush=False) for _ in range(2)]
        client.flush()
        assert client.wait(sids), client.terminated
        assert all(client.streams[sid].body == b"0123456789" * 40_000 for sid in sids)


def test_a_reset_stream_ends_alone(port: int) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=20) as s:
        client = H2Client(s)
        client.read_settings()
        sids = [client.request("GET", "/sse?60", flush=False) for _ in range(6)]
        client.flush()
        while not client.streams[sids[0]].body:
            assert client.pump()
        client.conn.reset_stream(sids[0], h2.errors.ErrorCodes.CANCEL)
        client.flush()
        assert client.wait(sids[1:]), client.terminated
        assert all(client.streams[sid].body == events(60) for sid in sids[1:])
        sid = client.request("GET", "/ok")
        assert client.wait([sid]) and client.streams[sid].status == 200


def pair() -> tuple[h2.connection.H2Connection, h2.connection.H2Connection, int]:
    """A client and a server connection, settings exchanged, one GET open on both."""
    client, server = h2_connection_pair()
    sid = client.get_next_available_stream_id()
    client.send_headers(
        sid, [(":method", "GET"), (":path", "/"), (":scheme", "http"), (":authority", "x")]
    )
    server.receive_data(client.data_to_send())
    server.send_headers(sid, [(b":status", b"200")])
    client.receive_data(server.data_to_send())
    return client, server, sid


def state(conn: h2.connection.H2Connection, sid: int) -> tuple[Any, ...]:
    stream = conn.streams[sid]
    return (
        conn.outbound_flow_control_window,
        stream.outbound_flow_control_window,
        conn.state_machine.state,
        stream.state_machine.state,
    )


@pytest.mark.parametrize("size", [1, 100, 16_384])
def test_frame_data_is_h2s_send_data(size: int) -> None:
    data = bytes(range(256)) * (size // 256) + b"x" * (size % 256)
    _, theirs, sid = pair()
    client, ours, _ = pair()
    theirs.send_data(sid, data)
    assert frame_data(ours, sid, data)
    wire = ours.data_to_send()
    assert wire == theirs.data_to_send()
    assert state(ours, sid) == state(theirs, sid)
    assert frame_data(ours, sid, b"more")
    events = client.receive_data(wire + ours.data_to_send())
    got = [e.data for e in events if isinstance(e, h2.events.DataReceived)]
    assert b"".join(got) == data + b"more"


def test_frame_data_refuses_what_it_must_leave_to_h2() -> None:
    client, server, sid = pair()
    before = state(server, sid)
    assert not frame_data(server, sid, b"")  # nothing to frame
    assert not frame_data(server, sid + 2, b"x")  # no such stream
    assert not frame_data(server, sid, b"x" * 16_385)  # over the peer's frame size
    assert state(server, sid) == before and server.data_to_send() == b""
    # a window smaller than the data
    client.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 10})
    server.receive_data(client.data_to_send())
    assert not frame_data(server, sid, b"x" * 11)
    assert frame_data(server, sid, b"x" * 10)
    server.data_to_send()
    # a stream this side ended, and one the peer reset
    server.end_stream(sid)
    assert not frame_data(server, sid, b"x")
    client2, server2, sid2 = pair()
    client2.reset_stream(sid2)
    server2.receive_data(client2.data_to_send())
    assert not frame_data(server2, sid2, b"x")
    # a connection that is closing
    _, server3, sid3 = pair()
    server3.close_connection()
    assert not frame_data(server3, sid3, b"x")
