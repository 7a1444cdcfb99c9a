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
nothing buffered and whose bytes fit the stream's flow-control window and the peer's
maximum frame size is framed by h2 (``H2Connection.send_data``) and flushed right there,
in the order the application sent it. That is what the sender task would have done with
it: nothing of that stream is ahead of it, and the whole message fits one frame. Every
other case — data already waiting, a window or frame too small, the end of the body,
trailers, a stream or connection h2 refuses (closed, reset) — goes the way it went
before, through the buffer and the sender task (which then meets the error and cleans
up, as before). Flushed bytes leave through
:mod:`servehall.server.hypercorn.write_coalesce`: one write per connection and loop
turn. Idempotent.
"""

from __future__ import annotations

from typing import Any

_INSTALLED = False


def install() -> None:
    """Wrap Hypercorn's ``H2Protocol.stream_send`` once per process (see the module
    docstring)."""
    global _INSTALLED
    if _INSTALLED:
        return
    import h2.exceptions
    from hypercorn.protocol.events import Body
    from hypercorn.protocol.h2 import H2Protocol

    original = H2Protocol.stream_send
    refused = (h2.exceptions.StreamClosedError, h2.exceptions.ProtocolError)

    async def stream_send(self: Any, event: Any) -> None:
        if type(event) is Body:
            sid = event.stream_id
            buffer = self.stream_buffers.get(sid)
            if buffer is not None and not buffer.buffer and not buffer._complete:
                conn = self.connection
                data = event.data
                try:
                    fits = (
                        0
                        < len(data)
                        <= min(conn.local_flow_control_window(sid), conn.max_outbound_frame_size)
                    )
                    if fits:
                        conn.send_data(sid, data)
                except refused:
                    fits = False  # the buffered path meets the same refusal and cleans up
                if fits:
                    await self._flush()
                    return
        await original(self, event)

    H2Protocol.stream_send = stream_send  # type: ignore[method-assign]
    _INSTALLED = True
