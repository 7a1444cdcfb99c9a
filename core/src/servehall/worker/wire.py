"""The transport between the API process and an engine worker: length-prefixed
MessagePack frames over two Unix stream sockets (msgspec's documented pattern:
https://jcristharif.com/msgspec/perf-tips.html#length-prefix-framing).

A frame is a 4-byte big-endian length followed by that many bytes of one msgspec
MessagePack message. The API process listens on a socket path; the worker connects
twice, first for commands (API → worker, read by the worker's event loop with
:func:`read_frame` on an asyncio stream), then for reports (worker → API, sent with a
:class:`FrameSender` from any of the worker's threads — the engine's step thread, the
event loop, the heartbeat thread — and read by the API process's event loop with
:func:`read_frame`). No I/O thread sits between a message and its reader (ZeroMQ passes
every message through one on each side); figures in docs/performance.md ("Where the
worker hop's time goes"), measured with ``bench/bench_ipc_hop.py``.
"""

from __future__ import annotations

import asyncio
import socket
import threading
from typing import Any

import msgspec

PREFIX_BYTES = 4
MAX_FRAME_BYTES = 1 << 30
"""A length above this is a broken stream, not a message."""


def frame(payload: bytes) -> bytes:
    """``payload`` with its 4-byte big-endian length in front."""
    return len(payload).to_bytes(PREFIX_BYTES, "big") + payload


async def read_frame(reader: asyncio.StreamReader) -> bytes:
    """The next frame's payload from ``reader`` (no loop turn when it is already buffered).

    Raises:
        asyncio.IncompleteReadError: the peer closed the stream (mid-frame or between).
        ValueError: the length prefix is implausible (a corrupt stream).
    """
    size = int.from_bytes(await reader.readexactly(PREFIX_BYTES), "big")
    if size > MAX_FRAME_BYTES:
        raise ValueError(f"frame of {size} bytes: the stream is corrupt")
    return await reader.readexactly(size)


class FrameSender:
    """Sends msgspec-encoded frames on a blocking stream socket from any thread.

    One lock serialises whole frames; each frame is encoded into a reused buffer right
    after its 4-byte prefix (``Encoder.encode_into``) and leaves with one ``sendall``.
    A full socket buffer (a reader that is behind) blocks the sending thread: that is
    the back-pressure.

    Args:
        sock: a connected, blocking ``AF_UNIX`` stream socket (owned: :meth:`close`).

    Raises (from :meth:`send`):
        OSError: the peer is gone (``BrokenPipeError``, ``ConnectionResetError``).
    """

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._lock = threading.Lock()
        self._encoder = msgspec.msgpack.Encoder()
        self._buffer = bytearray(256)

    def send(self, message: Any) -> None:
        """Encode ``message`` and send it as one frame (thread-safe)."""
        with self._lock:
            buf = self._buffer
            self._encoder.encode_into(message, buf, PREFIX_BYTES)
            buf[:PREFIX_BYTES] = (len(buf) - PREFIX_BYTES).to_bytes(PREFIX_BYTES, "big")
            self.sock.sendall(buf)

    def close(self) -> None:
        """Close the socket (frames already sent stay readable by the peer)."""
        with self._lock:
            self.sock.close()
