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
  (raising :class:`ClientGone`), and between two streamed body messages at least one
  event-loop turn (an I/O poll) passes, so that the connection's reader and the watcher
  run between two events even when the engine's deltas are already queued (a backlog
  would otherwise be sent in one go without a single I/O poll — what happens when the
  CPU is saturated). The usual stream waits for its next delta anyway, which is a turn:
  only a message sent in the same turn as the previous one yields first
  (:class:`LoopTurns`; a yield after every message was a profiled per-token cost,
  docs/performance.md, "A cheaper request").

Either way the work ends with :class:`ClientGone` or a cancellation; the choice streams'
cleanup then aborts the engine requests (freeing their KV cache), whether the engine
runs on a thread of this process or in a worker process.

A client that stays connected but stops *reading* is a third case: over HTTP/2 its
flow-control window closes, Hypercorn's write waits for a ``WINDOW_UPDATE`` that never
comes, and without a bound the request would hold its scheduler slot until the
connection closes. httpx/httpcore clients do this by accident: closing a response before
its end sends no ``RST_STREAM`` (encode/httpcore#943), so the unread bytes are never
credited back and the connection's window shrinks until every stream on it stalls.
:class:`StallSweeper` bounds it, as nginx's ``send_timeout`` does: a write that has not
completed after ``[server] send_timeout_s`` ends the request as a disconnect
(:attr:`DisconnectWatch.stalled`; recorded 499 ``client_stalled``).

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
import weakref

from starlette.types import Message, Receive, Send

log = logging.getLogger("servehall.api")


class ClientGone(Exception):
    """The client closed the connection or reset the stream (the request is aborted)."""


class LoopTurns:
    """Tells whether an event loop has started a new turn since a mark (one per loop).

    :meth:`mark` returns the number of the current turn; the number changes once the
    loop has run a callback scheduled at the mark, i.e. after its next I/O poll. One
    callback per loop turn in which anything was marked, however many streams mark in it.
    """

    __slots__ = ("_loop", "pending", "turn")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        #: the current turn's number (advanced by the callback of the first mark in it)
        self.turn = 0
        self.pending = False

    def mark(self) -> int:
        """The current turn's number; a later turn will have another one."""
        if not self.pending:
            self.pending = True
            self._loop.call_soon(self._advance)
        return self.turn

    def _advance(self) -> None:
        self.turn += 1
        self.pending = False


_TURNS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, LoopTurns] = (
    weakref.WeakKeyDictionary()
)


def loop_turns() -> LoopTurns:
    """The running loop's :class:`LoopTurns` (made on first use). Raises RuntimeError
    outside a running loop."""
    loop = asyncio.get_running_loop()
    turns = _TURNS.get(loop)
    if turns is None:
        turns = _TURNS[loop] = LoopTurns(loop)
    return turns


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

    __slots__ = (
        "_last_turn",
        "_receive",
        "_send",
        "_turns",
        "complete",
        "gone",
        "send_started",
        "stalled",
        "task",
        "work",
    )

    def __init__(self, receive: Receive, send: Send) -> None:
        self._receive = receive
        self._send = send
        self.gone = False
        self.complete = False
        #: ``time.monotonic()`` when the write now waiting began; 0.0 when none waits.
        self.send_started = 0.0
        #: the client stopped reading (:meth:`stall`), a kind of :attr:`gone`.
        self.stalled = False
        self.task: asyncio.Future[None] | None = None
        #: the request's work (set by the endpoint): a stall cancels it too, since the
        #: endpoint may be waiting on it alone (a client that closed after the last body
        #: message was handed over, while that message still waits for its window)
        self.work: asyncio.Future[None] | None = None
        self._turns: LoopTurns | None = None
        #: the loop turn of the last streamed body message (None: none, or the last send
        #: was not one)
        self._last_turn: int | None = None

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
        """Send ``message`` unless the client left; after a streamed body message sent
        in this same loop turn, yield to the loop once first (see the module docstring).

        Raises:
            ClientGone: before sending when the client already left (seen after that
                yield too).
        """
        turns = self._turns
        if self._last_turn is not None and turns is not None and self._last_turn == turns.turn:
            await asyncio.sleep(0)  # one I/O poll; lets the reader and the watcher run
        if self.gone:
            raise ClientGone
        more = message.get("more_body", False)
        if message["type"] == "http.response.body" and not more:
            self.complete = True
        self.send_started = time.monotonic()
        await self._send(message)
        self.send_started = 0.0
        if more:
            if turns is None:
                turns = self._turns = loop_turns()
            self._last_turn = turns.mark()
        else:
            self._last_turn = None

    def stall(self) -> None:
        """The client stopped reading: mark the request gone, end the watcher task and
        cancel the work (:attr:`work`), so that the endpoint waiting on either records the
        request and frees its slot (see :class:`StallSweeper`)."""
        self.stalled = True
        self.gone = True
        for task in (self.task, self.work):
            if task is not None and not task.done():
                task.cancel()

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


class StallSweeper:
    """Ends the requests whose client stopped reading (see the module docstring).

    One per API process. Each request's :class:`DisconnectWatch` is :meth:`add`-ed while
    its response is being sent; a task wakes every quarter of ``timeout_s`` and calls
    :meth:`DisconnectWatch.stall` on each watch whose current write has waited at least
    ``timeout_s`` seconds, so a stalled request ends between 1 and 1.25 × ``timeout_s``
    after its last write began. A write costs one ``time.monotonic()`` read, not a timer.
    The task runs only while some watch is registered. ``timeout_s`` 0 disables it.

    Source: nginx's ``send_timeout`` ("a timeout for transmitting a response to the
    client ... only between two successive write operations").
    """

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        #: requests ended so far
        self.stalled = 0
        self._watches: set[DisconnectWatch] = set()
        self._task: asyncio.Task[None] | None = None

    def add(self, watch: DisconnectWatch) -> None:
        """Watch ``watch``'s writes until :meth:`discard` (no-op when disabled)."""
        if self.timeout_s <= 0:
            return
        self._watches.add(watch)
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._sweep())

    def discard(self, watch: DisconnectWatch) -> None:
        """Stop watching ``watch`` (idempotent)."""
        self._watches.discard(watch)

    async def _sweep(self) -> None:
        interval = self.timeout_s / 4
        while self._watches:
            await asyncio.sleep(interval)
            now = time.monotonic()
            for watch in list(self._watches):
                started = watch.send_started
                if started and now - started >= self.timeout_s:
                    self._watches.discard(watch)
                    self.stalled += 1
                    watch.stall()


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
