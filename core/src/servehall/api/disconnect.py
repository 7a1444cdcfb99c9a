"""Noticing that a client went away, on both paths, even when the process is busy.

A client leaves by closing its connection (HTTP/1.1, HTTP/2) or resetting its stream
(HTTP/2 ``RST_STREAM``). Hypercorn reports both the same way: an ``http.disconnect``
message on the request's receive channel — queued by its reader when it sees the close,
or by its writer when a write fails. After that, Hypercorn drops whatever the app sends
*silently*, so an app that only sends never learns that nobody is listening: it would
generate to ``max_tokens`` and write every event into a dead stream.

:class:`DisconnectWatch` closes both gaps for one request:

* **receive path** — a watcher task reads the receive channel and sets :attr:`gone` on
  ``http.disconnect``; the endpoint cancels the request's work when the task ends;
* **send path** — :meth:`DisconnectWatch.send` refuses to send once :attr:`gone` is set
  (raising :class:`ClientGone`), and after each streamed body message it yields to the
  event loop once, so that the connection's reader and the watcher run between two
  events even when the engine's deltas are already queued (a backlog would otherwise be
  sent in one go without a single I/O poll — what happens when the CPU is saturated).

Either way the work ends with :class:`ClientGone` or a cancellation; the choice streams'
cleanup then aborts the engine requests (freeing their KV cache), whether the engine
runs on a thread of this process or in a worker process.

:func:`install_closed_write_filter` handles what is left below the app: asyncio logs
``socket.send() raised exception.`` for every write to a transport whose connection was
lost (after the fifth); the filter drops those records and logs one summary with a count
at most once per interval.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time

from starlette.types import Message, Receive, Send

log = logging.getLogger("servehall.api")


class ClientGone(Exception):
    """The client closed the connection or reset the stream (the request is aborted)."""


class DisconnectWatch:
    """Disconnect detection for one request (see the module docstring).

    Args:
        receive: the request's ASGI receive callable (its body already read).
        send: the request's ASGI send callable.

    Attributes:
        gone: True once the client is known to have left before the response was
            complete.
        complete: the last body message of the response was handed to the server
            (Hypercorn then queues ``http.disconnect`` itself; that is not a client
            leaving).
    """

    __slots__ = ("_receive", "_send", "complete", "gone", "task")

    def __init__(self, receive: Receive, send: Send) -> None:
        self._receive = receive
        self._send = send
        self.gone = False
        self.complete = False
        self.task: asyncio.Future[None] | None = None

    def start(self) -> asyncio.Future[None]:
        """Start the watcher task (on the running loop) and return it."""
        self.task = asyncio.ensure_future(self._watch())
        return self.task

    async def _watch(self) -> None:
        while True:
            message = await self._receive()
            if message["type"] == "http.disconnect":
                self.gone = not self.complete
                return

    async def send(self, message: Message) -> None:
        """Send ``message`` unless the client left.

        Raises:
            ClientGone: before sending when the client already left, or right after a
                streamed body message when the yield to the loop showed that it left.
        """
        if self.gone:
            raise ClientGone
        if message["type"] == "http.response.body" and not message.get("more_body", False):
            self.complete = True
        await self._send(message)
        if message.get("more_body", False):
            await asyncio.sleep(0)  # one I/O poll; lets the reader and the watcher run
            if self.gone:
                raise ClientGone

    async def stop(self) -> None:
        """Cancel the watcher task (idempotent)."""
        task = self.task
        if task is not None and not task.done():
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                # our own cancel of the watcher; re-raise only if this task was cancelled
                current = asyncio.current_task()
                if current is not None and current.cancelling():
                    raise


CLOSED_WRITE_MESSAGE = "socket.send() raised exception."
"""What asyncio logs for each write to a transport whose connection was lost."""


class ClosedWriteFilter(logging.Filter):
    """Drops asyncio's per-write ``socket.send() raised exception.`` warnings.

    Each dropped record is counted (:attr:`total`); at most once per ``interval_s``
    seconds one summary line with the count since the last summary is logged on the
    ``servehall.api`` logger instead.
    """

    def __init__(self, interval_s: float = 60.0) -> None:
        super().__init__()
        self.interval_s = interval_s
        self.total = 0
        self._pending = 0
        self._last = float("-inf")
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        if record.msg != CLOSED_WRITE_MESSAGE:
            return True
        now = time.monotonic()
        with self._lock:
            self.total += 1
            self._pending += 1
            if now - self._last < self.interval_s:
                return False
            count, self._pending, self._last = self._pending, 0, now
        log.warning(
            "%d write(s) to connection(s) already closed by the client were dropped "
            "(logged at most once per %.0f s)",
            count,
            self.interval_s,
        )
        return False


_FILTER: ClosedWriteFilter | None = None


def install_closed_write_filter(interval_s: float = 60.0) -> ClosedWriteFilter:
    """Add :class:`ClosedWriteFilter` to the ``asyncio`` logger once per process."""
    global _FILTER
    if _FILTER is None:
        _FILTER = ClosedWriteFilter(interval_s)
        logging.getLogger("asyncio").addFilter(_FILTER)
    return _FILTER
