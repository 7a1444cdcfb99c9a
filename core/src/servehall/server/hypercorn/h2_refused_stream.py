"""HTTP/2: a stream over ``SETTINGS_MAX_CONCURRENT_STREAMS`` is refused alone.

RFC 9113 §5.1.2: an endpoint that receives a HEADERS frame that would exceed its
advertised stream limit treats it as a stream error of type ``PROTOCOL_ERROR`` or
``REFUSED_STREAM``; ``REFUSED_STREAM`` tells the client the request was not processed
and may be retried. The ``h2`` library (4.x) instead raises ``TooManyStreamsError`` from
``receive_data``, and Hypercorn 0.18 turns that into a connection error: ``GOAWAY
PROTOCOL_ERROR`` and the connection is dropped with every stream on it, the ones within
the limit included (case N11: a client that opens M+1 streams in one write gets none of
the M answers).

:func:`install` wraps ``h2.connection.H2Connection._receive_headers_frame`` for
server-side connections: a HEADERS frame that opens a stream over the limit is still
decoded (so the HPACK dynamic table stays in step with the client's encoder) and opens
its stream in h2's state machine (so stream ids and flow control stay right and later
DATA frames for it are answered as stream errors), and that stream is then reset at once
with ``RST_STREAM(REFUSED_STREAM)``; the application never sees it. The other streams
and the connection carry on. Client-side connections (httpx in the same process) are
untouched.

Upstream: https://github.com/pgjones/hypercorn/issues/335 ("HTTP/2 Server terminates
all streams once exceeded", open). h2 raises ``TooManyStreamsError`` (a
``ProtocolError``) by design and leaves the choice to the server; Hypercorn's
``H2Protocol.handle`` closes the connection on any ``ProtocolError``. Listed in
docs/api.md, "Known deviations from upstream Hypercorn". Idempotent.
"""

from __future__ import annotations

from typing import Any

_INSTALLED = False


def install() -> None:
    """Patch ``h2``'s HEADERS handling once per process (see the module docstring)."""
    global _INSTALLED
    if _INSTALLED:
        return
    import h2.connection
    from h2.errors import ErrorCodes

    original = h2.connection.H2Connection._receive_headers_frame

    def _receive_headers_frame(self: Any, frame: Any) -> Any:
        if (
            self.config.client_side
            or frame.stream_id in self.streams
            or self.open_inbound_streams + 1 <= self.local_settings.max_concurrent_streams
        ):
            return original(self, frame)
        headers = h2.connection._decode_headers(self.decoder, frame.data)
        events = self.state_machine.process_input(h2.connection.ConnectionInputs.RECV_HEADERS)
        stream = self._get_or_create_stream(
            frame.stream_id, h2.connection.AllowedStreamIDs(not self.config.client_side)
        )
        stream.receive_headers(headers, "END_STREAM" in frame.flags, self.config.header_encoding)
        return stream.reset_stream(ErrorCodes.REFUSED_STREAM), events

    h2.connection.H2Connection._receive_headers_frame = _receive_headers_frame  # type: ignore[method-assign]
    _INSTALLED = True
