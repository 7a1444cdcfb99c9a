"""Key revocation and rotation broadcast over Redis pub/sub (``[auth] limits_url``).

Every process that changes a key (the admin API of any replica, ``servehall keys
revoke|rotate``) publishes the bare key id on :data:`CHANNEL` after its database
transaction commits. Every replica runs a :class:`KeyChangeListener` that drops that
key from its :class:`~servehall_auth.store.KeyStore` cache, so the next request with the
key reads the database again: a revocation is in force on every replica as soon as the
message arrives (milliseconds), not after ``key_cache_ttl_s``.

Pub/sub delivers at most once and only to connected subscribers, so the listener keeps
the cache honest when it cannot listen: while it is not subscribed (Redis down, the
connection lost) the store's cache is switched off (every request reads the database),
and after each (re)subscription the whole cache is dropped before it is used again, so
no message missed during the gap can leave a stale row behind.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from servehall import ChannelListener
from servehall_auth.metrics import KEY_CACHE_INVALIDATIONS

if TYPE_CHECKING:
    from redis.asyncio import Redis

    from servehall_auth.store import KeyStore

log = logging.getLogger("servehall_auth")

CHANNEL = "servehall:auth:key-changed"
"""The pub/sub channel; each message is one bare key id (``key_id``, not ``sh-…``)."""


async def publish_key_change(client: Redis, key_id: str) -> bool:
    """Announce that ``key_id`` changed. Returns False (and logs) when Redis is down:
    other replicas then see the change within ``key_cache_ttl_s``, or at once if their
    own listener lost Redis too (their cache is off meanwhile)."""
    try:
        await client.publish(CHANNEL, key_id)
        return True
    except Exception as exc:
        log.warning(
            "auth: could not broadcast the change of key sh-%s (%s); other replicas see it "
            "within key_cache_ttl_s",
            key_id,
            type(exc).__name__,
        )
        return False


class KeyChangeListener(ChannelListener):
    """Subscribes to :data:`CHANNEL` and invalidates ``store``'s cache (module docstring;
    reconnection by :class:`servehall.ChannelListener`).

    Args:
        client: a redis-py asyncio client (``decode_responses=True``).
        store: the key store whose cache to keep current.
        retry_s: pause between reconnection attempts (seconds).
    """

    def __init__(self, client: Redis, store: KeyStore, retry_s: float = 0.5) -> None:
        super().__init__(
            client,
            CHANNEL,
            self._changed,
            what="auth: key-change broadcast",
            lost_note="key cache off until Redis answers again",
            on_subscribed=self._subscribed,
            on_lost=self._lost,
            retry_s=retry_s,
            logger=log,
        )
        self.store = store

    async def start(self, timeout_s: float = 5.0) -> None:
        """Start listening; waits up to ``timeout_s`` for the first subscription (the
        cache stays off until then, so nothing is lost when it takes longer)."""
        self.store.cache_enabled = False
        await super().start(timeout_s)

    def _subscribed(self) -> None:
        # a change published while we were not listening must not survive
        self.store.forget_all()
        self.store.cache_enabled = True

    def _lost(self) -> None:
        self.store.cache_enabled = False
        self.store.forget_all()

    def _changed(self, key_id: str) -> None:
        self.store.forget(key_id)
        KEY_CACHE_INVALIDATIONS.labels("broadcast").inc()
