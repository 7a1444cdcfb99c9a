"""``servehall.worker.wire``: length-prefixed msgspec frames over a real Unix socket pair,
sent from several threads and read on the event loop."""

from __future__ import annotations

import asyncio
import socket
import threading

import msgspec
import pytest

from servehall.worker.wire import MAX_FRAME_BYTES, PREFIX_BYTES, FrameSender, frame, read_frame


def test_frame_is_a_big_endian_length_then_the_payload() -> None:
    assert frame(b"abc") == b"\x00\x00\x00\x03abc"
    assert frame(b"") == b"\x00" * PREFIX_BYTES


async def _read(reader: asyncio.StreamReader) -> bytes:
    """:func:`read_frame`, bounded: a framing bug fails the test instead of hanging it."""
    return await asyncio.wait_for(read_frame(reader), 5.0)


async def _open(sock: socket.socket) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """The reading side on the loop; the caller keeps the writer (a dropped writer closes
    the transport) and closes it."""
    return await asyncio.open_unix_connection(sock=sock)


async def test_frames_from_many_threads_arrive_whole() -> None:
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    sender = FrameSender(a)
    reader, writer = await _open(b)
    big = "x" * 100_000  # larger than the reused buffer and a socket buffer

    def send(n: int) -> None:
        for i in range(50):
            sender.send({"thread": n, "i": i, "pad": big if i % 10 == 0 else ""})

    threads = [threading.Thread(target=send, args=(n,), daemon=True) for n in range(4)]
    for t in threads:
        t.start()
    seen: dict[int, list[int]] = {n: [] for n in range(4)}
    decoder = msgspec.msgpack.Decoder()
    for _ in range(200):
        msg = decoder.decode(await _read(reader))
        seen[msg["thread"]].append(msg["i"])
        assert msg["pad"] == (big if msg["i"] % 10 == 0 else "")
    for t in threads:
        await asyncio.to_thread(t.join)
    assert all(order == list(range(50)) for order in seen.values())
    sender.close()
    with pytest.raises(asyncio.IncompleteReadError):
        await _read(reader)
    writer.close()


async def test_a_closed_peer_mid_frame_is_an_incomplete_read() -> None:
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    reader, writer = await _open(b)
    a.sendall(frame(b"0123456789")[:8])
    a.close()
    with pytest.raises(asyncio.IncompleteReadError):
        await _read(reader)
    writer.close()


async def test_an_implausible_length_is_a_corrupt_stream() -> None:
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    reader, writer = await _open(b)
    a.sendall((MAX_FRAME_BYTES + 1).to_bytes(PREFIX_BYTES, "big"))
    with pytest.raises(ValueError, match="corrupt"):
        await _read(reader)
    a.close()
    writer.close()


def test_sending_to_a_gone_peer_is_an_os_error() -> None:
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    b.close()
    sender = FrameSender(a)
    with pytest.raises(OSError):
        sender.send({"x": 1})
    sender.close()
