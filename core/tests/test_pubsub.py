"""servehall.pubsub.ChannelListener over a real redis-server: messages in order, the
catch-up callback after every (re)subscription, one "lost" and one "listening again" log
line per outage, and a callback that raises counted as a lost connection."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import pytest

from servehall.pubsub import ChannelListener


def _client(url: str) -> Any:
    from redis.asyncio import Redis

    return Redis.from_url(url, decode_responses=True, socket_timeout=2, socket_connect_timeout=2)


async def _until(pred: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not pred():
        assert asyncio.get_running_loop().time() < deadline, "not in time"
        await asyncio.sleep(0.02)


async def test_messages_subscriptions_and_an_outage(
    redis: Any, caplog: pytest.LogCaptureFixture
) -> None:
    got: list[str] = []
    events: list[str] = []
    listener = ChannelListener(
        _client(redis.url),
        "servehall-test",
        got.append,
        what="test broadcast",
        lost_note="nothing is delivered meanwhile",
        on_subscribed=lambda: events.append("subscribed"),
        on_lost=lambda: events.append("lost"),
        retry_s=0.1,
        logger=logging.getLogger("servehall.test_pubsub"),
    )
    publisher = _client(redis.url)
    caplog.set_level(logging.WARNING, logger="servehall.test_pubsub")
    try:
        await listener.start()
        assert listener.state() == "subscribed" and events == ["subscribed"]
        for text in ("one", "two", "three"):
            await publisher.publish("servehall-test", text)
        await _until(lambda: got == ["one", "two", "three"])
        redis.stop()
        await _until(lambda: listener.state() == "lost")
        await asyncio.sleep(0.5)  # several failed retries: still one "lost" line
        redis.start()
        await _until(lambda: listener.state() == "subscribed")
        await publisher.publish("servehall-test", "four")
        await _until(lambda: got[-1:] == ["four"])
    finally:
        await listener.close()
        await listener.client.aclose()
        await publisher.aclose()
    assert events[0] == "subscribed" and events[-1] == "subscribed" and "lost" in events
    lines = [r.getMessage() for r in caplog.records]
    lost = [line for line in lines if "test broadcast lost" in line]
    assert len(lost) == 1 and "nothing is delivered meanwhile" in lost[0], lines
    assert lines.count("test broadcast: listening again") == 1, lines
    assert listener.state() in ("subscribed", "lost")  # close keeps the last state


async def test_a_callback_that_raises_counts_as_a_lost_connection(redis: Any) -> None:
    got: list[str] = []
    lost: list[int] = []

    def on_message(text: str) -> None:
        if text == "bad":
            raise ValueError("a broken callback")
        got.append(text)

    listener = ChannelListener(
        _client(redis.url),
        "servehall-test",
        on_message,
        what="test broadcast",
        on_lost=lambda: lost.append(1),
        retry_s=0.05,
    )
    publisher = _client(redis.url)
    try:
        await listener.start()
        await publisher.publish("servehall-test", "bad")
        await _until(lambda: lost == [1])
        await _until(lambda: listener.state() == "subscribed")  # subscribed again
        await publisher.publish("servehall-test", "good")
        await _until(lambda: got == ["good"])
    finally:
        await listener.close()
        await listener.client.aclose()
        await publisher.aclose()


async def test_start_returns_when_redis_is_down_and_close_stops_the_retries() -> None:
    from servehall.testing.sockets import free_port

    listener = ChannelListener(
        _client(f"redis://127.0.0.1:{free_port()}/0"),
        "servehall-test",
        lambda text: None,
        what="test broadcast",
        retry_s=0.05,
    )
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    await listener.start(timeout_s=0.3)
    assert loop.time() - t0 < 3 and listener.state() == "lost"
    await listener.close()
    assert listener._task is None
    await listener.client.aclose()
