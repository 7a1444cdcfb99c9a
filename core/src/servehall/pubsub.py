"""A Redis pub/sub channel listener that survives outages: :class:`ChannelListener`.

Pub/sub delivers a message at most once and only to connected subscribers, so whoever
listens must catch up on what it missed while it was not subscribed. The listener calls
``on_subscribed`` after every (re)subscription (catch up there), ``on_message`` for each
message, and ``on_lost`` when the connection fails (then it retries every ``retry_s``).
Used by config revision announcements (:mod:`servehall.rollout.broadcast`) and the
``auth`` plugin's key-change broadcast.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from redis.asyncio import Redis

log = logging.getLogger("servehall")


def _nothing() -> None:
    return None


class ChannelListener:
    """Subscribes ``client`` to ``channel`` (see the module docstring).

    Args:
        client: a redis-py asyncio client (``decode_responses=True``).
        channel: the pub/sub channel.
        on_message: called with each message's data (text), on the event loop.
        what: names the broadcast in the log lines (``"config revision broadcast"``).
        lost_note: what happens meanwhile, appended to the "lost" log line.
        on_subscribed: called after each (re)subscription, before any message.
        on_lost: called when the subscription fails.
        retry_s: pause between reconnection attempts (seconds).
        logger: where the "lost" / "listening again" warnings go.

    Callbacks must not block; an exception from one counts as a lost connection.
    """

    def __init__(
        self,
        client: Redis,
        channel: str,
        on_message: Callable[[str], None],
        *,
        what: str,
        lost_note: str = "",
        on_subscribed: Callable[[], None] = _nothing,
        on_lost: Callable[[], None] = _nothing,
        retry_s: float = 0.5,
        logger: logging.Logger = log,
    ) -> None:
        self.client = client
        self.channel = channel
        self.on_message = on_message
        self.on_subscribed = on_subscribed
        self.on_lost = on_lost
        self.what = what
        self.lost_note = lost_note
        self.retry_s = retry_s
        self.log = logger
        self.subscribed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def start(self, timeout_s: float = 5.0) -> None:
        """Start listening; waits up to ``timeout_s`` for the first subscription."""
        self._task = asyncio.create_task(self._run(), name=f"servehall-{self.channel}")
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.subscribed.wait(), timeout_s)

    async def close(self) -> None:
        """Stop listening (the client stays open: its owner closes it)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
            self._task = None

    def state(self) -> str:
        """``subscribed`` or ``lost``."""
        return "subscribed" if self.subscribed.is_set() else "lost"

    async def _run(self) -> None:
        lost = False
        while True:
            pubsub = self.client.pubsub(ignore_subscribe_messages=True)
            try:
                await pubsub.subscribe(self.channel)
                self.on_subscribed()
                self.subscribed.set()
                if lost:
                    self.log.warning("%s: listening again", self.what)
                    lost = False
                while True:
                    msg = await pubsub.get_message(timeout=1.0)
                    if msg is not None and msg.get("type") == "message":
                        self.on_message(str(msg.get("data", "")))
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.subscribed.clear()
                self.on_lost()
                if not lost:
                    note = f"; {self.lost_note}" if self.lost_note else ""
                    self.log.warning("%s lost (%s)%s", self.what, type(exc).__name__, note)
                    lost = True
                await asyncio.sleep(self.retry_s)
            finally:
                with contextlib.suppress(Exception):
                    await pubsub.aclose()
