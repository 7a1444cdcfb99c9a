"""Revision announcements over a real redis-server (servehall.rollout.broadcast)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from servehall.rollout.broadcast import announce, announce_url, redis_client, revision_listener


async def _until(pred: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not pred():
        assert asyncio.get_running_loop().time() < deadline, "not in time"
        await asyncio.sleep(0.02)


async def test_listener_wakes_on_each_announcement_and_after_resubscribing(redis: Any) -> None:
    woken: list[int | None] = []
    listener = revision_listener(redis_client(redis.url), woken.append, retry_s=0.1)
    await listener.start()
    try:
        assert listener.state() == "subscribed" and woken == [None]
        assert await announce_url(redis.url, 7)
        await _until(lambda: woken == [None, 7])
        redis.stop()
        await _until(lambda: listener.state() == "lost")
        # a revision announced now is lost: the listener wakes once it listens again
        assert not await announce(listener.client, 8)
        redis.start()
        await _until(lambda: listener.state() == "subscribed" and woken[-1] is None)
        assert woken[:2] == [None, 7] and 8 not in woken
    finally:
        await listener.close()
        await listener.client.aclose()
