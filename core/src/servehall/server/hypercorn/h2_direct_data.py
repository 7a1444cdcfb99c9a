"""HTTP/2 body data that can leave at once is framed at once, not handed to the sender task.

Hypercorn's ``H2Protocol.stream_send`` puts every body message of a stream in that
stream's buffer and wakes the connection's sender task (``send_task``), which picks a
stream, pops its buffer up to the flow-control window and the frame size, frames it, and
goes round again — once more for the now empty stream, which it then marks blocked —
before it sleeps. For a server that streams one small SSE event per token that is, per
token: an event set and cleared, a task wake-up, the buffer copied in and out, and two
passes through the sender's loop. A profile of the API process under 256 streams
(docs/performance.md, "A cheaper request") had the sender task at about 24 % of its CPU.

:func:`install` wraps ``stream_send`` so that a body message (``Body``) whose stream has
nothing buffered and whose bytes fit the flow-control windows and the peer's maximum
frame size is framed at once (:func:`frame_data`: the bytes and window accounting of
h2's ``H2Connection.send_data``, without its ``DataFrame`` object, flag set and debug
calls — they were most of its cost), in the order the application sent it. That is what
the sender task would have done with it: nothing of that stream is ahead of it, and the
whole message fits one frame. The framed bytes wait in h2's outbound buffer for one flush
per connection at the end of the loop turn (``loop.call_soon``; the many streams an
engine step wakes in one turn share it) — or flush at once once :data:`FLUSH_AT` bytes
wait, with the writer's backpressure. Every flush takes h2's one outbound buffer in
order, so the bytes leave in the order they were framed whoever flushes them: the sender
task ending a stream, the headers of another. Every other case — data already waiting,
a window or frame too small, the end of the body, trailers, a stream h2 would refuse
(closed, reset, ended by us) or a connection that is not open — goes the way it went
before, through the buffer and the sender task (which then meets the error and cleans
up, as before). Flushed bytes leave through :mod:`servehall.server.hypercorn.write_coalesce`:
one write per connection and loop turn. Idempotent.
"""

from __future__ import annotations

import asyncio
import struct
from typing import Any

from h2.connection import ConnectionState, H2Connection
from h2.stream import StreamState

FLUSH_AT = 64 * 1024
"""Framed bytes waiting in the connection's outbound buffer past which a body message
flushes at once instead of at the end of the loop turn."""

_PENDING = "_servehall_flush_pending"
_FLUSHING: set[asyncio.Future[None]] = set()
_INSTALLED = False
_HEADER = struct.Struct(">HBBBL")
_SENDABLE = frozenset({StreamState.OPEN, StreamState.HALF_CLOSED_REMOTE})


def frame_data(conn: H2Connection, stream_id: int, data: bytes) -> bool:
    """Queue ``data`` (bytes) as one DATA frame of ``stream_id`` on a server connection,
    as ``conn.send_data(stream_id, data)`` does — the same frame bytes appended to the
    connection's outbound buffer, the same two flow-control windows reduced by
    ``len(data)``, no state change (h2's own transitions for DATA on an open stream of an
    open server connection change nothing) — without building a ``DataFrame``.

    Returns False, touching nothing, unless the connection is an open server connection,
    the stream is open or half-closed by the peer, and ``data`` is non-empty and fits both
    windows and the peer's maximum frame size; the caller then takes the buffered path.
    """
    if conn.state_machine.state is not ConnectionState.SERVER_OPEN:
        return False
    stream = conn.streams.get(stream_id)
    if stream is None or stream.state_machine.state not in _SENDABLE:
        return False
    n = len(data)
    if (
        not 0
        < n
        <= min(
            conn.outbound_flow_control_window,
            stream.outbound_flow_control_window,
            conn.max_outbound_frame_size,
        )
    ):
        return False
    conn._data_to_send += _HEADER.pack((n >> 8) & 0xFFFF, n & 0xFF, 0, 0, stream_id & 0x7FFFFFFF)
    conn._data_to_send += data
    stream.outbound_flow_control_window -= n
    conn.outbound_flow_control_window -= n
    return True


def _flush_soon(protocol: Any) -> None:
    """The end-of-turn flush of an ``H2Protocol`` (see the module docstring): its
    ``_flush`` in a task (writing can wait for the writer's backpressure)."""
    protocol.__dict__.pop(_PENDING, None)
    if protocol.connection._data_to_send:
        task = asyncio.ensure_future(protocol._flush())
        _FLUSHING.add(task)  # referenced until done
        task.add_done_callback(_FLUSHING.discard)


def install() -> None:
    """Wrap Hypercorn's ``H2Protocol.stream_send`` once per process (see the module
    docstring)."""
    global _INSTALLED
    if _INSTALLED:
        return
    from hypercorn.protocol.events import Body
    from hypercorn.protocol.h2 import H2Protocol

    original = H2Protocol.stream_send

    async def stream_send(self: Any, event: Any) -> None:
        if type(event) is Body:
            buffer = self.stream_buffers.get(event.stream_id)
            if (
                buffer is not None
                and not buffer.buffer
                and not buffer._complete
                and frame_data(self.connection, event.stream_id, event.data)
            ):
                if len(self.connection._data_to_send) >= FLUSH_AT:
                    await self._flush()  # at once, with the writer's backpressure
                elif self.__dict__.get(_PENDING) is None:
                    self.__dict__[_PENDING] = asyncio.get_running_loop().call_soon(
                        _flush_soon, self
                    )
                return
        await original(self, event)

    H2Protocol.stream_send = stream_send  # type: ignore[method-assign]
    _INSTALLED = True
