"""Key revocation/rotation broadcast over a real ``redis-server``: two key stores (as on
two replicas) on one database, each with a long key cache; a change made through one is
in force on the other as soon as the pub/sub message arrives, and a store whose listener
lost Redis reads the database every time (so no revocation is missed)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from servehall_auth.broadcast import KeyChangeListener, publish_key_change
from servehall_auth.redis_limiter import make_client
from servehall_auth.store import KeyStore, api_key, make_engine, metadata
from servehall_auth.testing import RedisServer, redis_server_binary

pytestmark = pytest.mark.skipif(
    redis_server_binary() is None, reason="redis-server not installed (.ci/services.d/redis.sh)"
)

PEPPER = "broadcast-test-pepper-0123"


@pytest.fixture
def redis_server() -> Iterator[RedisServer]:
    with RedisServer() as srv:
        yield srv


@pytest.fixture
async def replicas(
    tmp_path: Path, redis_server: RedisServer
) -> AsyncIterator[list[tuple[KeyStore, KeyChangeListener, Any]]]:
    url = f"sqlite+aiosqlite:///{tmp_path / 'keys.db'}"
    engine = make_engine(url)
    async with engine.begin() as conn:
        await conn.run_sync(lambda c: metadata.create_all(c, tables=[api_key]))
    await engine.dispose()
    out = []
    for _ in range(2):
        store = KeyStore(make_engine(url), PEPPER, cache_ttl_s=300)
        client = make_client(redis_server.url, 0.5)

        async def publish(key_id: str, client: Any = client) -> None:
            await publish_key_change(client, key_id)

        store.on_change = publish
        listener = KeyChangeListener(client, store, retry_s=0.1)
        await listener.start()
        assert listener.subscribed.is_set() and store.cache_enabled
        out.append((store, listener, client))
    yield out
    for store, listener, client in out:
        await listener.close()
        await client.aclose()
        await store.engine.dispose()


async def _wait_outcome(store: KeyStore, key_id: str, key: str, want: str) -> float:
    t0 = time.monotonic()
    while True:
        outcome, _ = await store.verify(key_id, key)
        if outcome == want:
            return time.monotonic() - t0
        if time.monotonic() - t0 > 5:
            raise AssertionError(f"still {outcome!r}, wanted {want!r}")
        await asyncio.sleep(0.02)


async def test_revocation_on_a_reaches_b(replicas: list[Any]) -> None:
    (a, _, _), (b, _, _) = replicas
    rec, key = await a.create(tenant="t")
    assert (await b.verify(rec.key_id, key))[0] == "ok"  # cached on B for 300 s
    await a.revoke(rec.key_id)
    # without the broadcast B would answer "ok" from its cache for 300 s
    assert await _wait_outcome(b, rec.key_id, key, "revoked") < 1.0


async def test_rotation_on_b_reaches_a(replicas: list[Any]) -> None:
    (a, _, _), (b, _, _) = replicas
    rec, old = await a.create(tenant="t")
    assert (await a.verify(rec.key_id, old))[0] == "ok"
    _, new = await b.rotate(rec.key_id)
    await _wait_outcome(a, rec.key_id, old, "bad_secret")
    assert (await a.verify(rec.key_id, new))[0] == "ok"


async def test_listener_without_redis_turns_cache_off(
    replicas: list[Any], redis_server: RedisServer
) -> None:
    (a, _, _), (b, b_listener, _) = replicas
    rec, key = await a.create(tenant="t")
    assert (await b.verify(rec.key_id, key))[0] == "ok"
    redis_server.stop()
    for _ in range(100):
        if not b.cache_enabled:
            break
        await asyncio.sleep(0.05)
    assert not b.cache_enabled and not b_listener.subscribed.is_set()
    await a.revoke(rec.key_id)  # the publish fails (logged); B reads the database
    assert (await b.verify(rec.key_id, key))[0] == "revoked"
    redis_server.start()
    for _ in range(100):
        if b.cache_enabled:
            break
        await asyncio.sleep(0.05)
    assert b.cache_enabled and b_listener.subscribed.is_set()
    rec2, key2 = await a.create(tenant="t")
    assert (await b.verify(rec2.key_id, key2))[0] == "ok"
    await a.revoke(rec2.key_id)
    assert await _wait_outcome(b, rec2.key_id, key2, "revoked") < 1.0


async def test_forget_during_fetch_is_not_cached(tmp_path: Path) -> None:
    """A row read while a change arrives is used once, never kept in the cache."""
    url = f"sqlite+aiosqlite:///{tmp_path / 'k.db'}"
    store = KeyStore(make_engine(url), PEPPER, cache_ttl_s=300)
    async with store.engine.begin() as conn:
        await conn.run_sync(lambda c: metadata.create_all(c, tables=[api_key]))
    rec, key = await store.create(tenant="t")
    real = store._get_row

    async def slow_get(key_id: str) -> Any:
        row = await real(key_id)
        store.forget(key_id)  # a broadcast arrives while the row is in flight
        return row

    store._get_row = slow_get  # type: ignore[method-assign]
    assert (await store.verify(rec.key_id, key))[0] == "ok"
    assert rec.key_id not in store._cache
    await store.engine.dispose()
