"""Tests of servehall.server.bridge_wire: the scope fields that cross the wire and
:class:`FrameProtocol` over a real Unix socket pair — every message queued in one loop
turn leaves as one frame, frames split across reads are put back together, a frame above
the size limit closes the connection."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import msgspec

from servehall.server.bridge_wire import (
    SCOPE_KEYS,
    FrameProtocol,
    asgi_scope,
    wire_scope,
)
from servehall.worker.wire import MAX_FRAME_BYTES, PREFIX_BYTES


class Recorder(FrameProtocol):
    """Keeps every message received, in order."""

    def __init__(self) -> None:
        super().__init__()
        self.messages: list[list[Any]] = []
        self.arrived = asyncio.Event()

    def message_received(self, message: list[Any]) -> None:
        self.messages.append(message)
        self.arrived.set()


async def _pair() -> tuple[Recorder, socket.socket]:
    """A :class:`Recorder` on one end of a Unix socket pair; the other end raw."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    theirs.setblocking(False)
    loop = asyncio.get_running_loop()
    _, proto = await loop.create_unix_connection(Recorder, sock=ours)
    return proto, theirs


def _frame(messages: list[Any]) -> bytes:
    body = msgspec.msgpack.encode(messages)
    return len(body).to_bytes(PREFIX_BYTES, "big") + body


async def _read_frames(raw: socket.socket, count: int) -> list[list[Any]]:
    """Read exactly ``count`` frames from ``raw``; each is returned as its message list."""
    loop = asyncio.get_running_loop()
    buf = b""
    frames: list[list[Any]] = []
    while len(frames) < count:
        chunk = await asyncio.wait_for(loop.sock_recv(raw, 65536), 5)
        assert chunk, "closed"
        buf += chunk
        while len(buf) >= PREFIX_BYTES:
            size = int.from_bytes(buf[:PREFIX_BYTES], "big")
            if len(buf) < PREFIX_BYTES + size:
                break
            frames.append(msgspec.msgpack.decode(buf[PREFIX_BYTES : PREFIX_BYTES + size]))
            buf = buf[PREFIX_BYTES + size :]
    assert buf == b""
    return frames


def test_wire_scope_keeps_only_the_wire_fields_and_asgi_scope_rebuilds_tuples() -> None:
    scope = {
        "type": "http",
        "http_version": "2",
        "method": "POST",
        "scheme": "https",
        "path": "/v1/completions",
        "raw_path": b"/v1/completions",
        "query_string": b"a=1",
        "root_path": "",
        "headers": [(b"host", b"x"), (b"authorization", b"Bearer k")],
        "client": ("10.0.0.1", 5000),
        "server": ("127.0.0.1", 8000),
        "state": {"principal": "someone"},  # the primary's own, never from a frontend
        "extensions": {"http.response.trailers": {}},
        "servehall.caller": "batch",
    }
    fields = wire_scope(scope)
    assert set(fields) == set(SCOPE_KEYS)
    # as msgpack carries it: tuples become lists
    fields = msgspec.msgpack.decode(msgspec.msgpack.encode(fields))
    back = asgi_scope(fields)
    assert back["headers"] == [(b"host", b"x"), (b"authorization", b"Bearer k")]
    assert back["client"] == ("10.0.0.1", 5000) and back["server"] == ("127.0.0.1", 8000)
    assert back["state"] == {} and back["extensions"] == {}
    assert back["asgi"]["version"] == "3.0"
    assert "servehall.caller" not in back
    assert {k: back[k] for k in ("method", "path", "raw_path", "query_string")} == {
        "method": "POST",
        "path": "/v1/completions",
        "raw_path": b"/v1/completions",
        "query_string": b"a=1",
    }


def test_asgi_scope_without_client_or_server() -> None:
    back = asgi_scope({"type": "http", "path": "/", "headers": [], "client": None})
    assert back["client"] is None and "server" not in back and back["headers"] == []


async def test_messages_of_one_loop_turn_leave_as_one_frame() -> None:
    proto, raw = await _pair()
    try:
        for i in range(5):
            proto.push((11, i, b"x" * i, True))
        await asyncio.sleep(0)  # the flush runs on the next turn
        proto.push((12, 0, True))  # a later turn: a frame of its own
        frames = await _read_frames(raw, 2)
        assert frames == [[[11, i, b"x" * i, True] for i in range(5)], [[12, 0, True]]]
    finally:
        raw.close()
        proto.transport.close()  # type: ignore[union-attr]


async def test_frames_split_across_reads_and_several_per_read_are_decoded() -> None:
    proto, raw = await _pair()
    loop = asyncio.get_running_loop()
    try:
        data = _frame([[1, 1, b"a", False], [2, 1]]) + _frame([[3, 7]])
        for i in range(len(data)):  # byte by byte
            await loop.sock_sendall(raw, data[i : i + 1])
            await asyncio.sleep(0)
        await loop.sock_sendall(raw, _frame([[4, 7]]) + _frame([[2, 8]]))  # two in one read
        deadline = loop.time() + 5
        while len(proto.messages) < 5:
            assert loop.time() < deadline, proto.messages
            await asyncio.sleep(0.01)
        assert proto.messages == [[1, 1, b"a", False], [2, 1], [3, 7], [4, 7], [2, 8]]
        assert not proto._inbuf
    finally:
        raw.close()
        proto.transport.close()  # type: ignore[union-attr]


async def test_an_oversized_frame_closes_the_connection() -> None:
    proto, raw = await _pair()
    loop = asyncio.get_running_loop()
    try:
        await loop.sock_sendall(raw, (MAX_FRAME_BYTES + 1).to_bytes(PREFIX_BYTES, "big"))
        await asyncio.wait_for(proto.closed, 5)
        assert proto.transport is None and proto.messages == []
        proto.push((11, 1, b"", False))  # after the loss: dropped, no error
    finally:
        raw.close()


async def test_the_peer_closing_resolves_closed_and_drops_the_outbox() -> None:
    proto, raw = await _pair()
    proto.push((11, 1, b"never sent", False))  # queued, then the connection goes
    raw.close()
    await asyncio.wait_for(proto.closed, 5)
    assert proto._outbox == [] and proto.transport is None
