"""The shared limiter store (``[auth] limits_url``) against a real ``redis-server``:
the Lua scripts' all-or-nothing debit, credit, expiry, two stores (two replicas) sharing
buckets, concurrency, fail-closed/fail-open when Redis stops, recovery, the start-up
check, the key-change broadcast and the URL checks of ``config check``."""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator, Iterator

import pytest
from pydantic import ValidationError

from servehall import (
    AdmissionRequest,
    ConfigError,
    Limits,
    Policy,
    Principal,
    ServiceUnavailableError,
)
from servehall_auth.limiter import Bucket
from servehall_auth.metrics import LIMITER_ERRORS
from servehall_auth.ratelimit import RateLimiter
from servehall_auth.redis_limiter import (
    LimiterUnavailableError,
    RedisLimiterStore,
    check_limits_url,
    safe_url,
)
from servehall_auth.settings import AuthSettings
from servehall_auth.testing import RedisServer, redis_server_binary

pytestmark = pytest.mark.skipif(
    redis_server_binary() is None, reason="redis-server not installed (.ci/services.d/redis.sh)"
)


@pytest.fixture(scope="module")
def redis_server() -> Iterator[RedisServer]:
    with RedisServer() as srv:
        yield srv


@pytest.fixture
async def store(redis_server: RedisServer) -> AsyncIterator[RedisLimiterStore]:
    # a fresh key prefix per test: tests never see each other's buckets
    import uuid

    s = await RedisLimiterStore.connect(redis_server.url, 2.0)
    s.prefix = f"t{uuid.uuid4().hex[:8]}:{{rl}}:"
    yield s
    await s.close()


def settings(**kw: object) -> AuthSettings:
    return AuthSettings(pepper="p" * 16, **kw)  # type: ignore[arg-type]


def req(p: Principal, prompt: int = 10, max_tokens: int = 20) -> AdmissionRequest:
    return AdmissionRequest("r", "/v1/completions", "demo", p, prompt, max_tokens, 1)


def _count(operation: str, outcome: str) -> float:
    return LIMITER_ERRORS.labels(operation, outcome)._value.get()


# capacity 6/min refills 0.1 per second: a test's own run time barely moves a level
SLOW = 6.0


async def test_all_or_nothing_and_retry_after(store: RedisLimiterStore) -> None:
    a, b = Bucket("a", 600), Bucket("b", SLOW)
    r = await store.acquire([(a, 10), (b, 6)])
    assert r.ok
    assert r.levels["a"] == pytest.approx(590, abs=1)
    assert r.levels["b"] == pytest.approx(0, abs=0.05)
    r = await store.acquire([(a, 10), (b, 1)])
    assert not r.ok
    assert r.retry_after_s == pytest.approx(10.0, abs=0.6)  # b refills 0.1/s
    levels = await store.levels([a, b])
    assert levels["a"] == pytest.approx(590, abs=1)  # nothing debited on refusal
    r = await store.acquire([(b, 7)])
    assert not r.ok and math.isinf(r.retry_after_s)  # more than the capacity: never fits


async def test_credit_caps_at_capacity_and_debits(store: RedisLimiterStore) -> None:
    a = Bucket("a", SLOW)
    await store.acquire([(a, 3)])
    await store.credit([(a, 100)])
    assert (await store.levels([a]))["a"] == pytest.approx(SLOW)
    await store.credit([(a, -8)])  # a settle that charges more than was reserved
    assert (await store.levels([a]))["a"] == pytest.approx(-2, abs=0.05)


async def test_full_buckets_do_not_stay_in_redis(store: RedisLimiterStore) -> None:
    a = Bucket("a", 60000)  # refills 1000/s
    await store.acquire([(a, 1)])
    key = store.prefix + "a"
    ttl = await store.client.pttl(key)
    assert 0 < ttl <= 1000 + 1  # expires once full again (+1 s slack)
    await store.credit([(a, 1)])
    assert await store.client.exists(key) == 0  # full: deleted at once


async def test_two_replicas_share_buckets(redis_server: RedisServer) -> None:
    """Two stores (as on two replicas) on one Redis: a 10 rpm key gets 10, not 20."""
    s1 = await RedisLimiterStore.connect(redis_server.url)
    s2 = await RedisLimiterStore.connect(redis_server.url)
    s1.prefix = s2.prefix = "shared-test:{rl}:"
    try:
        lim1, lim2 = RateLimiter(s1, settings()), RateLimiter(s2, settings())
        p = Principal(id="sh-two", policy=Policy(limits=Limits(rpm=10)))
        ok = refused = 0
        for i in range(20):
            try:
                await (lim1 if i % 2 else lim2).reserve(req(p))
                ok += 1
            except Exception as exc:
                assert type(exc).__name__ == "RateLimitError"
                refused += 1
        assert (ok, refused) == (10, 10)
    finally:
        await s1.close()
        await s2.close()


async def test_concurrent_acquires_never_overdraw(store: RedisLimiterStore) -> None:
    a = Bucket("c", 50)
    results = await asyncio.gather(*(store.acquire([(a, 1)]) for _ in range(120)))
    assert sum(r.ok for r in results) == 50


async def test_settle_and_release_with_redis(store: RedisLimiterStore) -> None:
    lim = RateLimiter(store, settings())
    p = Principal(id="sh-settle", policy=Policy(limits=Limits(rpm=60, tpm=600)))
    res = await lim.reserve(req(p, prompt=10, max_tokens=90))  # reserves 100 tokens
    assert res is not None
    tokens = Bucket("p:sh-settle:tokens", 600)
    assert (await store.levels([tokens]))[tokens.key] == pytest.approx(500, abs=1)
    await res.settle(10, 5)  # used 15: 85 back
    assert (await store.levels([tokens]))[tokens.key] == pytest.approx(585, abs=1)
    res2 = await lim.reserve(req(p))
    assert res2 is not None
    await res2.release()
    assert (await store.levels([tokens]))[tokens.key] == pytest.approx(585, abs=1)


async def test_redis_down_fail_closed_then_open_then_recovers() -> None:
    srv = RedisServer().start()
    try:
        closed_store = await RedisLimiterStore.connect(srv.url, 0.3)
        open_store = await RedisLimiterStore.connect(srv.url, 0.3)
        closed = RateLimiter(closed_store, settings(limits_retry_after_s=3))
        opened = RateLimiter(open_store, settings(limits_on_error="open"))
        p = Principal(id="sh-outage", policy=Policy(limits=Limits(rpm=100, tpm=100000)))
        res = await closed.reserve(req(p))
        assert res is not None

        srv.stop()
        rejected0, admitted0 = _count("acquire", "rejected"), _count("acquire", "admitted")
        lost0 = _count("settle", "lost")
        with pytest.raises(ServiceUnavailableError) as ei:
            await closed.reserve(req(p))
        assert ei.value.status == 503
        assert ei.value.code == "rate_limiter_unavailable"
        assert ei.value.headers["Retry-After"] == "3"
        assert await opened.reserve(req(p)) is None  # fail open: admitted, unlimited
        await res.settle(1, 1)  # a refund that cannot reach Redis is counted, not raised
        assert _count("acquire", "rejected") == rejected0 + 1
        assert _count("acquire", "admitted") == admitted0 + 1
        assert _count("settle", "lost") == lost0 + 1
        assert closed.health.failing

        srv.start()  # same port: the clients reconnect on their own
        for lim in (closed, opened):
            got = None
            for _ in range(50):
                try:
                    got = await lim.reserve(req(p))
                    break
                except ServiceUnavailableError:
                    await asyncio.sleep(0.1)
            assert got is not None
        assert not closed.health.failing
        await closed_store.close()
        await open_store.close()
    finally:
        srv.close()


async def test_store_errors_are_one_line() -> None:
    srv = RedisServer().start()
    s = await RedisLimiterStore.connect(srv.url, 0.3)
    srv.close()
    with pytest.raises(LimiterUnavailableError) as ei:
        await s.acquire([(Bucket("x", 10), 1)])
    assert "\n" not in str(ei.value) and str(ei.value)
    await s.close()


async def test_unreachable_at_start_is_one_clear_line() -> None:
    srv = RedisServer()  # a free port nobody listens on
    url = f"redis://:hunter2secret@127.0.0.1:{srv.port}/0"
    srv.close()
    with pytest.raises(ConfigError) as ei:
        await RedisLimiterStore.connect(url, 0.5)
    msg = ei.value.message
    assert msg.startswith(f"auth: cannot reach limits_url redis://:***@127.0.0.1:{srv.port}/0: ")
    assert "\n" not in msg and "hunter2secret" not in msg


@pytest.mark.parametrize(
    "url",
    [
        "redis://localhost:6379/0",
        "redis://redis",
        "rediss://user:pw@cache.example:6380/2",
        "unix:///run/redis/redis.sock?db=1",
    ],
)
def test_limits_url_forms_accepted(url: str) -> None:
    assert check_limits_url(url) == url
    assert settings(limits_url=url).limits_url is not None


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("localhost:6379", "must start with redis://"),
        ("http://redis:6379/0", "must start with redis://"),
        ("redis://:6379/0", "needs a host"),
        ("redis://redis:99999/0", "port"),
        ("redis://redis:6379/cache", "database must be a number"),
        ("unix://", "socket path"),
    ],
)
def test_limits_url_bad_forms(url: str, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        check_limits_url(url)
    with pytest.raises(ValidationError, match=why):
        settings(limits_url=url)


def test_safe_url_masks_password() -> None:
    assert safe_url("redis://u:pw@h:1/0") == "redis://u:***@h:1/0"
    assert safe_url("redis://h:1/0") == "redis://h:1/0"
