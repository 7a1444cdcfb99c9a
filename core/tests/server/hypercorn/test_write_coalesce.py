"""One socket write per connection and loop turn (:mod:`servehall.server.hypercorn.write_coalesce`),
on a real Hypercorn (``conn_server.py``): many streamed responses on one HTTP/2
connection arrive whole and in order with far fewer writes than frames, against the bare
Hypercorn's one write per frame; a large body still arrives whole under flow control."""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from servehall.testing.rawhttp import H2Client
from servehall.testing.sockets import free_port

SERVER = Path(__file__).with_name("conn_server.py")
STREAMS, EVENTS = 16, 20


@pytest.fixture
def start() -> Iterator[Callable[[bool], int]]:
    procs: list[subprocess.Popen[bytes]] = []

    def run(fixes: bool) -> int:
        free = free_port()
        args = [sys.executable, str(SERVER), str(free), "--count-writes"]
        proc = subprocess.Popen(
            args + (["--fixes"] if fixes else []),
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        procs.append(proc)
        assert proc.stdout is not None and proc.stdout.readline().strip() == b"ready"
        return free

    yield run
    for proc in procs:
        proc.terminate()
        proc.wait(10)


def _streams_on_one_connection(port: int) -> tuple[list[bytes], int]:
    """Open STREAMS ``/sse`` streams at once; their bodies and the server's writes."""
    with socket.create_connection(("127.0.0.1", port), timeout=20) as s:
        client = H2Client(s)
        client.read_settings()
        sids = [client.request("GET", f"/sse?{EVENTS}", flush=False) for _ in range(STREAMS)]
        client.flush()
        assert client.wait(sids), client.terminated
        bodies = [client.streams[sid].body for sid in sids]
        sid = client.request("GET", "/writes")
        assert client.wait([sid])
        return bodies, int(client.streams[sid].body)


def test_streams_arrive_whole_with_fewer_writes_than_frames(
    start: Callable[[bool], int],
) -> None:
    expected = b"".join(b"event %d\n" % i for i in range(EVENTS))
    bare_bodies, bare_writes = _streams_on_one_connection(start(False))
    bodies, writes = _streams_on_one_connection(start(True))
    assert bodies == [expected] * STREAMS and bare_bodies == bodies
    frames = STREAMS * EVENTS
    assert bare_writes >= frames  # the control: Hypercorn writes every DATA frame alone
    assert writes <= frames / 4, (writes, bare_writes)


def test_large_bodies_arrive_whole_under_flow_control(start: Callable[[bool], int]) -> None:
    """8 responses of 1 MB at once on one connection: far past the client's 64 KiB
    flow-control windows and the held bytes' high-water mark, every byte arrives in
    order."""
    port = start(True)
    size = 1_000_000
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        client = H2Client(s)
        client.read_settings()
        sids = [client.request("GET", f"/big?{size}", flush=False) for _ in range(8)]
        client.flush()
        assert client.wait(sids), client.terminated
        expected = b"0123456789" * (size // 10)
        assert all(client.streams[sid].body == expected for sid in sids)
