"""Workaround for a Hypercorn 0.18 bug: a connection the client closed stays open
(``CLOSE-WAIT``) until ``keep_alive_timeout``.

Cause: ``hypercorn.asyncio.tcp_server.TCPServer.run`` reads inside a task group that
also holds the keep-alive *idle task* (``_idle_timeout``: wait ``keep_alive_timeout``,
then close). When the client closes an idle connection, ``_read_data`` sees EOF and
hands ``Closed`` to the protocol, but neither the HTTP/1.1 nor the HTTP/2 protocol
answers with ``Closed`` when no request is in flight, so nothing stops the idle task:
the task group — and with it the ``finally: _close()`` that closes the socket — waits
for the whole keep-alive timeout (servehall's default: 75 s). A bare Hypercorn does the
same; at a few hundred new connections per second the process runs out of file
descriptors (cases N29, N32). Upstream: the same code is still in Hypercorn's main
branch; closest report https://github.com/pgjones/hypercorn/issues/241 (listed in
docs/api.md, "Known deviations from upstream Hypercorn").

:func:`install` wraps two ``TCPServer`` methods:

* ``_read_data``: once reading has ended (EOF, reset, read error), the idle task is
  stopped, so the task group ends as soon as the requests still in flight (which
  Hypercorn has already told ``http.disconnect``) finish, and the socket is closed;
* ``protocol_send``: an ``Updated(idle=True)`` after reading has ended does not start a
  new idle task (nothing more can arrive on the connection).

Nothing changes while the client keeps its side open. Idempotent.
"""

from __future__ import annotations

from typing import Any

_INSTALLED = False
_READ_DONE = "_servehall_read_done"


def install() -> None:
    """Patch Hypercorn's asyncio ``TCPServer`` once per process (see the module docstring)."""
    global _INSTALLED
    if _INSTALLED:
        return
    from hypercorn.asyncio.tcp_server import TCPServer
    from hypercorn.events import Updated

    original_read = TCPServer._read_data
    original_send = TCPServer.protocol_send

    async def _read_data(self: Any) -> None:
        try:
            await original_read(self)
        finally:
            setattr(self, _READ_DONE, True)
            await self.idle_task.stop()

    async def protocol_send(self: Any, event: Any) -> None:
        if isinstance(event, Updated) and event.idle and getattr(self, _READ_DONE, False):
            await self.idle_task.stop()
            return
        await original_send(self, event)

    TCPServer._read_data = _read_data  # type: ignore[method-assign]
    TCPServer.protocol_send = protocol_send  # type: ignore[method-assign]
    _INSTALLED = True
