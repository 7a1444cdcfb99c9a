"""Workaround for a Hypercorn 0.18 HTTP/2 bug: an early response kills the connection.

When the app answers before the request body has fully arrived (413 for an oversized
body, 415/400 refused before reading), Hypercorn removes the stream; the client's
next DATA frame for it then raises ``KeyError`` in ``H2Protocol._handle_events`` and
the whole connection — every other stream on it — is dropped. (The ``StreamEnded``
branch already tolerates this; ``DataReceived`` does not.)

:func:`install` wraps ``_handle_events`` so such DATA frames are acknowledged (keeping
the connection's flow-control window open) and discarded: the client finishes its
upload and then reads the early response. (RFC 9113 §8.1 also allows resetting the
stream with ``NO_ERROR``, but curl 7.88 and httpx treat that as a failure and never show
the response, so servehall does not.) Idempotent.

The app side of the same problem lives in :func:`servehall.api.body.drain_body`: after
an early response the endpoint keeps reading (and dropping) what Hypercorn already
queued for it, because Hypercorn's per-request queue is bounded and a full one would
stall the connection's reader.
"""

from __future__ import annotations

import contextlib
from typing import Any

_INSTALLED = False


def install() -> None:
    """Patch Hypercorn's H2 protocol once per process (see the module docstring)."""
    global _INSTALLED
    if _INSTALLED:
        return
    import h2.events
    import h2.exceptions
    from hypercorn.protocol.h2 import H2Protocol

    original = H2Protocol._handle_events

    async def _handle_events(self: Any, events: list[Any]) -> None:
        for event in events:
            if isinstance(event, h2.events.DataReceived) and event.stream_id not in self.streams:
                with contextlib.suppress(
                    h2.exceptions.ProtocolError, h2.exceptions.StreamClosedError
                ):
                    self.connection.acknowledge_received_data(
                        event.flow_controlled_length, event.stream_id
                    )
                await self._flush()
                continue
            await original(self, [event])

    H2Protocol._handle_events = _handle_events  # type: ignore[method-assign]
    _INSTALLED = True
