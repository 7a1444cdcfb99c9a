"""servehall.api.disconnect: the send guard, the watcher and the closed-write log filter."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from servehall.api.disconnect import (
    CLOSED_WRITE_MESSAGE,
    ClientGone,
    ClosedWriteFilter,
    DisconnectWatch,
    StallSweeper,
)


class FakeChannel:
    """An ASGI receive/send pair: after ``fail_after`` body sends the "connection" is lost
    and, as Hypercorn does, ``http.disconnect`` is queued on the receive channel while
    later sends are dropped silently. Sends never yield (a socket with room to write)."""

    def __init__(self, fail_after: int) -> None:
        self.fail_after = fail_after
        self.inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.sent = 0
        self.dropped = 0

    async def receive(self) -> dict[str, Any]:
        return await self.inbox.get()

    async def send(self, message: dict[str, Any]) -> None:
        if self.sent >= self.fail_after:
            self.dropped += 1
            if self.dropped == 1:
                self.inbox.put_nowait({"type": "http.disconnect"})
            return
        self.sent += 1


async def _backlog(watch: DisconnectWatch, n: int) -> int:
    """Send ``n`` streamed events back to back (deltas already queued); the count sent."""
    done = 0
    for _ in range(n):
        await watch.send({"type": "http.response.body", "body": b"data: x\n\n", "more_body": True})
        done += 1
    return done


async def test_a_backlog_stops_at_the_first_failed_write() -> None:
    ch = FakeChannel(fail_after=3)
    watch = DisconnectWatch(ch.receive, ch.send)
    watch.start()
    with pytest.raises(ClientGone):
        await _backlog(watch, 1000)
    assert watch.gone
    assert ch.sent == 3 and ch.dropped == 1  # nothing written after the loss was noticed
    await watch.stop()


async def test_without_the_guard_a_backlog_is_written_into_the_dead_stream() -> None:
    """The control: sending straight to the channel never notices the disconnect."""
    ch = FakeChannel(fail_after=3)
    for _ in range(1000):
        await ch.send({"type": "http.response.body", "body": b"x", "more_body": True})
    assert ch.dropped == 997


class Ticker:
    """Counts the event-loop turns it gets (one per ``sleep(0)``) while it runs."""

    def __init__(self) -> None:
        self.ticks = 0
        self.task = asyncio.ensure_future(self._run())

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(0)
            self.ticks += 1


async def test_a_backlog_yields_to_the_loop_between_every_two_messages() -> None:
    ch = FakeChannel(fail_after=10**6)
    watch = DisconnectWatch(ch.receive, ch.send)
    ticker = Ticker()
    await _backlog(watch, 50)
    assert ticker.ticks >= 48  # 49 gaps; the ticker's first turn only starts it
    ticker.task.cancel()


async def test_messages_in_separate_turns_do_not_yield_again() -> None:
    """A stream that waits for its next delta (a loop turn) is not made to wait twice."""
    ch = FakeChannel(fail_after=10**6)
    watch = DisconnectWatch(ch.receive, ch.send)
    ticker = Ticker()
    for _ in range(50):
        await asyncio.sleep(0)  # waiting for the next delta
        await watch.send({"type": "http.response.body", "body": b"x", "more_body": True})
    assert ticker.ticks <= 55  # one turn per message, not two
    ticker.task.cancel()


async def test_receive_path_disconnect_refuses_the_next_send() -> None:
    ch = FakeChannel(fail_after=10**6)
    watch = DisconnectWatch(ch.receive, ch.send)
    task = watch.start()
    ch.inbox.put_nowait({"type": "http.request", "body": b"", "more_body": False})
    ch.inbox.put_nowait({"type": "http.disconnect"})
    await asyncio.wait_for(task, 5)
    with pytest.raises(ClientGone):
        await watch.send({"type": "http.response.start", "status": 200, "headers": []})
    assert ch.sent == 0


async def test_stop_cancels_the_watcher() -> None:
    ch = FakeChannel(fail_after=1)
    watch = DisconnectWatch(ch.receive, ch.send)
    task = watch.start()
    await watch.stop()
    assert task.cancelled() and not watch.gone


def test_closed_write_warnings_become_one_counted_line(caplog: pytest.LogCaptureFixture) -> None:
    flt = ClosedWriteFilter(interval_s=3600)
    logger = logging.getLogger("test.asyncio.closed-writes")
    logger.addFilter(flt)
    try:
        with caplog.at_level(logging.WARNING):
            for _ in range(1000):
                logger.warning(CLOSED_WRITE_MESSAGE)
            logger.warning("something else")
    finally:
        logger.removeFilter(flt)
    messages = [r.getMessage() for r in caplog.records]
    assert CLOSED_WRITE_MESSAGE not in messages
    assert flt.total == 1000
    summaries = [m for m in messages if "already closed by the client" in m]
    assert summaries == [
        "1 write(s) to connection(s) already closed by the client were dropped "
        "(logged at most once per 3600 s)"
    ]
    assert "something else" in messages


async def test_disconnect_after_the_last_body_is_not_a_client_leaving() -> None:
    """Hypercorn queues http.disconnect itself once the response is complete."""
    ch = FakeChannel(fail_after=10**6)
    watch = DisconnectWatch(ch.receive, ch.send)
    task = watch.start()
    await watch.send({"type": "http.response.body", "body": b"x", "more_body": True})
    await watch.send({"type": "http.response.body", "body": b"", "more_body": False})
    ch.inbox.put_nowait({"type": "http.disconnect"})
    await asyncio.wait_for(task, 5)
    assert watch.complete and not watch.gone


class StuckChannel:
    """A peer that stopped reading: the first body send never completes (an HTTP/2
    stream whose flow-control window stays shut)."""

    def __init__(self) -> None:
        self.inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.sent = 0

    async def receive(self) -> dict[str, Any]:
        return await self.inbox.get()

    async def send(self, message: dict[str, Any]) -> None:
        if message["type"] == "http.response.body":
            await asyncio.Event().wait()
        self.sent += 1


async def test_a_write_the_client_never_accepts_ends_the_request() -> None:
    ch = StuckChannel()
    watch = DisconnectWatch(ch.receive, ch.send)
    watcher = watch.start()
    sweeper = StallSweeper(0.2)
    sweeper.add(watch)
    work = asyncio.ensure_future(_backlog(watch, 3))
    t0 = asyncio.get_running_loop().time()
    done, _ = await asyncio.wait({work, watcher}, timeout=5, return_when=asyncio.FIRST_COMPLETED)
    assert done == {watcher} and not work.done()  # the endpoint's wait ends; it cancels work
    assert 0.2 <= asyncio.get_running_loop().time() - t0 < 2
    assert watch.stalled and watch.gone and sweeper.stalled == 1
    work.cancel()
    await watch.stop()
    with pytest.raises(ClientGone):  # nothing more is written to the stalled stream
        await watch.send({"type": "http.response.body", "body": b"x", "more_body": True})


async def test_a_slow_but_reading_client_is_not_ended() -> None:
    """Writes that each complete within the timeout never trip it, however many: 40 writes
    of 50 ms (2 s in all) under a 1 s timeout. The margin per write (20×) keeps a loaded
    CI machine's event-loop delays from looking like a stall."""

    async def slow_send(message: dict[str, Any]) -> None:
        await asyncio.sleep(0.05)

    ch = FakeChannel(fail_after=10**6)
    watch = DisconnectWatch(ch.receive, slow_send)
    watch.start()
    sweeper = StallSweeper(1.0)
    sweeper.add(watch)
    assert await _backlog(watch, 40) == 40  # 2 s of writing, 50 ms each
    assert not watch.stalled and sweeper.stalled == 0
    sweeper.discard(watch)
    await watch.stop()


async def test_timeout_zero_disables_the_sweeper() -> None:
    ch = StuckChannel()
    watch = DisconnectWatch(ch.receive, ch.send)
    sweeper = StallSweeper(0)
    sweeper.add(watch)
    assert sweeper._task is None
