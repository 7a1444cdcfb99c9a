"""New config revisions announced over Redis pub/sub (``[server] config_broadcast_url``).

Whoever stores a revision (a replica's ``/admin/config`` or SIGHUP, ``servehall config
apply | rollback``) publishes its number on :data:`CHANNEL` after the transaction
commits. Each replica's listener (:func:`revision_listener`) wakes its follower
(:class:`~servehall.rollout.live.LiveConfig`) on each message, which then reads the
newest revision from the database and applies it: the database stays the only source of
what to run, Redis only says "look now" (within milliseconds instead of the next poll).

Pub/sub delivers at most once and only to connected subscribers, so the follower keeps
polling the table every ``config_poll_s`` as the catch-up, and after each
(re)subscription the listener wakes it once, so a revision announced while it was not
listening is applied at once.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from servehall.pubsub import ChannelListener

if TYPE_CHECKING:
    from redis.asyncio import Redis

log = logging.getLogger("servehall.config")

CHANNEL = "servehall:config:revision"
"""The pub/sub channel; each message is a revision number (decimal text)."""


def redis_client(url: str, timeout_s: float = 2.0) -> Redis:
    """A redis-py asyncio client for ``url`` (``redis://``, ``rediss://``, ``unix://``);
    ``timeout_s`` bounds connecting and each reply of a command."""
    from redis.asyncio import Redis

    return Redis.from_url(
        url, decode_responses=True, socket_connect_timeout=timeout_s, socket_timeout=timeout_s
    )


async def announce(client: Redis, revision: int) -> bool:
    """Publish ``revision`` on :data:`CHANNEL`. False (logged) when Redis cannot be
    reached: replicas then apply it at their next poll of the table."""
    try:
        await client.publish(CHANNEL, str(revision))
        return True
    except Exception as exc:
        log.warning(
            "could not announce config revision %s over Redis (%s): replicas apply it "
            "at their next poll (config_poll_s)",
            revision,
            type(exc).__name__,
        )
        return False


async def announce_url(url: str, revision: int) -> bool:
    """:func:`announce` with a client of its own (the CLI)."""
    client = redis_client(url)
    try:
        return await announce(client, revision)
    finally:
        await client.aclose()


def revision_listener(
    client: Redis, wake: Callable[[int | None], None], retry_s: float = 0.5
) -> ChannelListener:
    """A listener on :data:`CHANNEL` that calls ``wake(revision)`` for each message and
    ``wake(None)`` after each (re)subscription (see the module docstring); start it
    with ``await listener.start()``.

    Args:
        client: a redis-py asyncio client (``decode_responses=True``); closed by its owner.
        wake: called on the event loop; must not block.
        retry_s: pause between reconnection attempts (seconds).
    """
    return ChannelListener(
        client,
        CHANNEL,
        lambda data: wake(int(data) if data.isdigit() else None),
        what="config revision broadcast",
        lost_note="following by polling the table until Redis answers again",
        on_subscribed=lambda: wake(None),
        retry_s=retry_s,
        logger=log,
    )
