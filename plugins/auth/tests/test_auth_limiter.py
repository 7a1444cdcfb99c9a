"""Token buckets and token-aware reservations (reserve, settle, release)."""

from __future__ import annotations

import math

import pytest

from servehall import AdmissionRequest, Limits, Policy, Principal, RateLimitError, Reservation
from servehall_auth.limiter import Bucket, MemoryLimiterStore
from servehall_auth.ratelimit import RateLimiter, format_duration
from servehall_auth.settings import AuthSettings, TenantSettings


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def settings(**kw: object) -> AuthSettings:
    return AuthSettings(pepper="p" * 16, **kw)  # type: ignore[arg-type]


def req(p: Principal, prompt: int = 10, max_tokens: int = 20, n: int = 1) -> AdmissionRequest:
    return AdmissionRequest("r", "/v1/completions", "demo", p, prompt, max_tokens, n)


async def test_bucket_all_or_nothing() -> None:
    clock = Clock()
    store = MemoryLimiterStore(clock)
    a, b = Bucket("a", 60), Bucket("b", 6)
    r = await store.acquire([(a, 10), (b, 6)])
    assert r.ok and r.levels == {"a": 50, "b": 0}
    r = await store.acquire([(a, 10), (b, 1)])
    assert not r.ok and r.retry_after_s == pytest.approx(10.0)  # b refills 0.1/s
    assert (await store.levels([a]))["a"] == 50  # nothing debited on refusal
    clock.t += 10
    assert (await store.acquire([(a, 10), (b, 1)])).ok
    r = await store.acquire([(b, 7)])
    assert not r.ok and math.isinf(r.retry_after_s)


async def test_refill_caps_at_capacity_and_credit() -> None:
    clock = Clock()
    store = MemoryLimiterStore(clock)
    a = Bucket("a", 60)
    await store.acquire([(a, 30)])
    clock.t += 1000
    assert (await store.levels([a]))["a"] == 60
    await store.acquire([(a, 60)])
    await store.credit([(a, 100)])
    assert (await store.levels([a]))["a"] == 60
    await store.credit([(a, -70)])
    assert (await store.levels([a]))["a"] == -10


async def test_n_plus_one_requests_per_minute() -> None:
    limiter = RateLimiter(MemoryLimiterStore(Clock()), settings())
    p = Principal(id="sh-k1", policy=Policy(limits=Limits(rpm=3)))
    held = [await limiter.reserve(req(p)) for _ in range(3)]
    assert all(isinstance(h, Reservation) for h in held)
    assert held[-1] is not None and held[-1].headers()["x-ratelimit-remaining-requests"] == "0"
    with pytest.raises(RateLimitError) as ei:
        await limiter.reserve(req(p))
    e = ei.value
    assert e.status == 429
    assert e.headers["Retry-After"] == "20"  # 1 request refills in 60/3 s
    assert e.headers["x-ratelimit-limit-requests"] == "3"
    assert e.headers["x-ratelimit-remaining-requests"] == "0"
    assert e.headers["x-ratelimit-reset-requests"] == "1m0s"


async def test_rejected_requests_consume_nothing() -> None:
    limiter = RateLimiter(MemoryLimiterStore(Clock()), settings())
    p = Principal(id="sh-k1", policy=Policy(limits=Limits(rpm=2)))
    await limiter.reserve(req(p))
    await limiter.reserve(req(p))
    for _ in range(5):
        with pytest.raises(RateLimitError):
            await limiter.reserve(req(p))
    # the refusals did not push the refill further away
    levels = await limiter.store.levels([Bucket("p:sh-k1:requests", 2)])
    assert levels["p:sh-k1:requests"] == 0


async def test_tokens_reserved_then_settled_to_usage() -> None:
    limiter = RateLimiter(MemoryLimiterStore(Clock()), settings())
    p = Principal(id="sh-k2", policy=Policy(limits=Limits(tpm=100)))
    b = Bucket("p:sh-k2:tokens", 100)
    r = await limiter.reserve(req(p, prompt=10, max_tokens=20, n=2))  # 10 + 20×2
    assert r is not None
    assert (await limiter.store.levels([b]))[b.key] == 50
    assert r.headers()["x-ratelimit-remaining-tokens"] == "50"
    await r.settle(10, 5)
    assert (await limiter.store.levels([b]))[b.key] == 85
    await r.settle(10, 5)  # idempotent
    await r.release()  # no effect after settle
    assert (await limiter.store.levels([b]))[b.key] == 85


async def test_release_gives_everything_back() -> None:
    limiter = RateLimiter(MemoryLimiterStore(Clock()), settings())
    p = Principal(id="sh-k3", policy=Policy(limits=Limits(rpm=1, tpm=100)))
    r = await limiter.reserve(req(p, 30, 30))
    assert r is not None
    with pytest.raises(RateLimitError):
        await limiter.reserve(req(p))
    await r.release()
    assert await limiter.reserve(req(p, 30, 70)) is not None


async def test_request_larger_than_tpm() -> None:
    limiter = RateLimiter(MemoryLimiterStore(Clock()), settings())
    p = Principal(id="sh-k4", policy=Policy(limits=Limits(tpm=50)))
    with pytest.raises(RateLimitError) as ei:
        await limiter.reserve(req(p, 10, 100))
    assert ei.value.code == "tokens_exceed_limit"
    # C14: every per-key 429 carries Retry-After (the full window here) and the headers
    assert ei.value.headers["Retry-After"] == "60"
    assert ei.value.headers["x-ratelimit-limit-tokens"] == "50"
    assert ei.value.headers["x-ratelimit-remaining-tokens"] == "50"
    assert ei.value.headers["x-ratelimit-reset-tokens"] == "0ms"


async def test_tenant_and_default_limits() -> None:
    s = settings(default_rpm=5, tenants={"t": TenantSettings(rpm=3)})
    limiter = RateLimiter(MemoryLimiterStore(Clock()), s)
    a = Principal(id="sh-a", tenant="t")
    b = Principal(id="sh-b", tenant="t")
    await limiter.reserve(req(a))
    await limiter.reserve(req(a))
    await limiter.reserve(req(b))
    with pytest.raises(RateLimitError):  # tenant bucket (3) is empty
        await limiter.reserve(req(b))
    c = Principal(id="sh-c", tenant="other")
    for _ in range(5):
        await limiter.reserve(req(c))
    with pytest.raises(RateLimitError):  # default per-principal rpm
        await limiter.reserve(req(c))


async def test_unlimited_principal_gets_no_reservation() -> None:
    limiter = RateLimiter(MemoryLimiterStore(Clock()), settings())
    assert await limiter.reserve(req(Principal(id="sh-free"))) is None


def test_format_duration() -> None:
    assert format_duration(0) == "0ms"
    assert format_duration(0.25) == "250ms"
    assert format_duration(1) == "1s"
    assert format_duration(1.5) == "1.5s"
    assert format_duration(60) == "1m0s"
    assert format_duration(3723) == "1h2m3s"


async def test_memory_store_stays_bounded() -> None:
    clock = Clock()
    store = MemoryLimiterStore(clock, sweep_every=10)
    for i in range(9):
        assert (await store.acquire([(Bucket(f"k{i}", 60), 1)])).ok
    assert len(store) == 9
    clock.t += 2  # every bucket has refilled its one unit
    await store.acquire([(Bucket("fresh", 60), 1)])  # the 10th call sweeps
    assert len(store) == 1
