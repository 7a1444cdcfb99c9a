"""One socket write per connection and event-loop turn, not one per HTTP/2 frame.

Hypercorn's ``TCPServer.protocol_send`` writes every chunk a protocol hands it to the
socket at once (``writer.write(data); await writer.drain()``): with HTTP/2 that is one
``send(2)`` per DATA frame. servehall streams many requests over one connection (the
``openai`` client and ``httpx`` multiplex up to 100 streams on a connection), and one
worker step message wakes all of them in the same event-loop turn: 16 streams made 16
``send`` calls, each one a trip through the kernel's TCP stack charged to the API
process. A profile of the API process under 16 concurrent streams
(``py-spy record``, docs/performance.md, "The API process's per-token path") had
``_SelectorSocketTransport.write`` as its largest single cost (19 % of its samples) and
the event loop's ``epoll_wait`` next to it.

:func:`install` wraps ``protocol_send`` so that the bytes of every ``RawData`` sent in
one event-loop turn are gathered in one buffer and written with **one**
``transport.write`` at the start of the next turn (``loop.call_soon``): the frames still
leave in the order they were sent, a frame waits at most for the rest of the current turn
(microseconds, nothing that waits on I/O), and backpressure is kept — once the
transport's buffer and the held bytes pass :data:`HIGH_WATER` bytes, the held bytes are
written at once and the sender waits for ``drain()`` as before. ``Closed`` and
``TCPServer._close`` write what is held first, so nothing already sent is lost or
reordered past the end of the connection. This is Nagle's idea (RFC 896) bounded by the
event loop's turn instead of a timer, the way ``TCP_CORK`` users flush at the end of a
batch. Idempotent.
"""

from __future__ import annotations

import asyncio
from typing import Any

HIGH_WATER = 64 * 1024
"""Held + transport-buffered bytes past which a send is written at once and waits for
``drain()`` (asyncio's own default high-water mark for a socket transport)."""

_HELD = "_servehall_held"
_INSTALLED = False


def _write_held(server: Any) -> None:
    """Write the bytes held for ``server`` (a Hypercorn ``TCPServer``) in one call.

    A connection that is already closing drops them (its reader ends the requests on
    it, as Hypercorn does for a write that fails)."""
    held: bytearray | None = server.__dict__.pop(_HELD, None)
    if not held:
        return
    writer = server.writer
    if writer.transport.is_closing():
        return
    try:
        writer.write(held)
    except RuntimeError:  # written after write_eof(): the connection is ending
        return


def install() -> None:
    """Patch Hypercorn's asyncio ``TCPServer`` once per process (see the module docstring).

    Install after :mod:`servehall.server.hypercorn.conn_release`, whose
    ``protocol_send`` this wraps."""
    global _INSTALLED
    if _INSTALLED:
        return
    from hypercorn.asyncio.tcp_server import TCPServer
    from hypercorn.events import Closed, RawData

    previous_send = TCPServer.protocol_send
    previous_close = TCPServer._close

    async def protocol_send(self: Any, event: Any) -> None:
        if type(event) is RawData:
            held: bytearray | None = self.__dict__.get(_HELD)
            if held is None:
                held = self.__dict__[_HELD] = bytearray()
                asyncio.get_running_loop().call_soon(_write_held, self)
            held += event.data
            writer = self.writer
            if writer.transport.get_write_buffer_size() + len(held) >= HIGH_WATER:
                _write_held(self)
                async with self.send_lock:
                    try:
                        await writer.drain()
                    except (ConnectionError, RuntimeError):
                        await self.protocol.handle(Closed())
            return
        if isinstance(event, Closed):
            _write_held(self)
        await previous_send(self, event)

    async def _close(self: Any) -> None:
        _write_held(self)
        await previous_close(self)

    TCPServer.protocol_send = protocol_send  # type: ignore[method-assign]
    TCPServer._close = _close  # type: ignore[method-assign]
    _INSTALLED = True
