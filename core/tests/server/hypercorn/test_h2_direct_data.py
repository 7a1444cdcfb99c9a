"""HTTP/2 body data framed at once (:mod:`servehall.server.hypercorn.h2_direct_data`) on a
real Hypercorn (``conn_server.py --fixes``): small events on many streams, bodies larger
than the flow-control window (the buffered path, then the direct one again), and a stream
reset while its siblings stream — every byte arrives, in order, on a connection that
stays usable."""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import h2.errors
import h2.settings
import pytest

from servehall.testing.rawhttp import H2Client
from servehall.testing.sockets import free_port

SERVER = Path(__file__).with_name("conn_server.py")


@pytest.fixture
def port() -> Iterator[int]:
    free = free_port()
    proc = subprocess.Popen(
        [sys.executable, str(SERVER), str(free), "--fixes", "--max-streams", "64"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == b"ready"
        yield free
    finally:
        proc.terminate()
        proc.wait(10)


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
