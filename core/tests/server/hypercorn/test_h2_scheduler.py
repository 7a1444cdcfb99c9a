"""HTTP/2 send scheduling (:mod:`servehall.server.hypercorn.h2_scheduler`): the round-robin stream
set on its own, and on a real Hypercorn (``conn_server.py --fixes``) with many streams,
bodies and PRIORITY frames on one connection."""

from __future__ import annotations

import socket
from pathlib import Path

import priority
import pytest

from servehall.server.hypercorn.h2_scheduler import RoundRobinStreams
from servehall.testing.rawhttp import H2Client

SERVER = Path(__file__).with_name("conn_server.py")


def take(streams: RoundRobinStreams, n: int) -> list[int]:
    return [next(streams) for _ in range(n)]


def test_unblocked_streams_take_turns() -> None:
    rr = RoundRobinStreams()
    for sid in (1, 3, 5):
        rr.insert_stream(sid)
    assert take(rr, 7) == [1, 3, 5, 1, 3, 5, 1]


def test_blocked_streams_are_skipped_and_rejoin_at_the_end() -> None:
    rr = RoundRobinStreams()
    for sid in (1, 3, 5):
        rr.insert_stream(sid)
    rr.block(3)
    assert take(rr, 4) == [1, 5, 1, 5]
    rr.unblock(3)
    rr.unblock(1)  # already unblocked: keeps its place
    assert take(rr, 3) == [1, 5, 3]


def test_no_unblocked_stream_is_a_deadlock_error() -> None:
    rr = RoundRobinStreams()
    with pytest.raises(priority.DeadlockError):
        next(rr)
    rr.insert_stream(1)
    rr.block(1)
    with pytest.raises(priority.DeadlockError):
        next(rr)
    rr.remove_stream(1)
    with pytest.raises(priority.DeadlockError):
        next(rr)


def test_errors_match_the_priority_tree() -> None:
    rr = RoundRobinStreams()
    rr.insert_stream(1)
    with pytest.raises(priority.DuplicateStreamError):
        rr.insert_stream(1)
    for call in (rr.block, rr.unblock, rr.remove_stream):
        with pytest.raises(priority.MissingStreamError):
            call(7)
    with pytest.raises(priority.MissingStreamError):
        rr.reprioritize(7, depends_on=1, weight=200)
    rr.reprioritize(1, depends_on=None, weight=256, exclusive=True)  # accepted, ignored
    assert next(rr) == 1


def test_many_streams_with_bodies_and_priority_frames_on_one_connection(port: int) -> None:
    """32 uploads (within the connection window) and 32 GETs interleaved on one
    connection, some streams reprioritized by PRIORITY frames: every stream is answered
    in full and the connection stays usable."""
    with socket.create_connection(("127.0.0.1", port), timeout=20) as s:
        client = H2Client(s)
        client.read_settings()
        sids = []
        for i in range(32):
            sids.append(client.request("POST", "/read", body=b"x" * (100 * (i + 1)), flush=False))
            sids.append(client.request("GET", "/ok", flush=False))
        for sid in sids[::5]:
            client.conn.prioritize(sid, weight=200, depends_on=0, exclusive=False)
        client.flush()
        assert client.wait(sids), client.terminated
        bodies = [client.streams[sid].body for sid in sids[0::2]]
        assert bodies == [str(100 * (i + 1)).encode() for i in range(32)]
        assert all(client.streams[sid].status == 200 for sid in sids)
        sid = client.request("GET", "/ok")
        assert client.wait([sid]) and client.streams[sid].status == 200
