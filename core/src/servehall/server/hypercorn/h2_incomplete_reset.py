"""An HTTP/2 response the application leaves unfinished is reset, not left open.

When an ASGI application returns (or fails) after ``http.response.start`` but before its
last body message (``more_body`` false), Hypercorn's ``HTTPStream.app_send(None)`` sends
``StreamClosed`` to the connection, and ``H2Protocol.stream_send`` only forgets the
stream: no ``END_STREAM``, no ``RST_STREAM``. The client's stream stays open until the
connection ends — an SSE client waits for the next event forever (with a keep-alive
connection, until its own read timeout), and an HTTP/2 proxy keeps the stream counted
against ``MAX_CONCURRENT_STREAMS``. Over HTTP/1.1 the same case already closes the
connection (the message is incomplete), which the client sees at once.

Servehall ends a response that way when its request path loses its source mid-answer:
an API-process frontend whose primary went away
(:mod:`servehall.server.frontend`), or an application error after the first streamed
byte. :func:`install` wraps ``H2Protocol.stream_send`` so that a ``StreamClosed`` for a
stream whose body was never completed (its send buffer exists and is not complete) and
that h2 can still send on resets it with ``RST_STREAM(INTERNAL_ERROR)`` — what RFC 9113
§8.1 asks of a server that cannot complete a response ("the server SHOULD send a
RST_STREAM with an error code of ... INTERNAL_ERROR"), and what nginx and Envoy send
when an upstream response is cut. The rest of the stream's cleanup is Hypercorn's, as
before. A completed body (its buffer complete, or already removed by the sender task
after ``END_STREAM``), a stream the client reset, or a closed connection are left alone.
Idempotent.
"""

from __future__ import annotations

from typing import Any

from h2.errors import ErrorCodes
from h2.stream import StreamState

_INSTALLED = False
_SENDABLE = frozenset({StreamState.OPEN, StreamState.HALF_CLOSED_REMOTE})


async def reset_if_incomplete(protocol: Any, stream_id: int) -> bool:
    """Reset ``stream_id`` of ``protocol`` (a Hypercorn ``H2Protocol``) with
    ``INTERNAL_ERROR`` if its response body was started and never completed and h2 can
    still send on it. Its send buffer is emptied and closed (nothing more of it may
    leave) and the stream handed to the sender task, which removes it the way it
    removes any stream h2 refuses to send on. The reset frame waits in h2's outbound
    buffer for the caller's flush.

    Returns:
        True if the stream was reset.
    """
    buffer = protocol.stream_buffers.get(stream_id)
    if buffer is None or buffer._complete:
        return False
    stream = protocol.connection.streams.get(stream_id)
    if stream is None or stream.state_machine.state not in _SENDABLE:
        return False
    protocol.connection.reset_stream(stream_id, error_code=ErrorCodes.INTERNAL_ERROR)
    await buffer.close()
    protocol.priority.unblock(stream_id)
    await protocol.has_data.set()
    return True


def install() -> None:
    """Wrap Hypercorn's ``H2Protocol.stream_send`` once per process (see the module
    docstring)."""
    global _INSTALLED
    if _INSTALLED:
        return
    from hypercorn.protocol.events import StreamClosed
    from hypercorn.protocol.h2 import H2Protocol

    original = H2Protocol.stream_send

    async def stream_send(self: Any, event: Any) -> None:
        if type(event) is StreamClosed and await reset_if_incomplete(self, event.stream_id):
            await self._flush()
        await original(self, event)

    H2Protocol.stream_send = stream_send  # type: ignore[method-assign]
    _INSTALLED = True
