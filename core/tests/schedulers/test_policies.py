"""The ``priority`` and ``fair`` policies (and what they share with ``fcfs``), driven by a
deterministic fake clock and a fake engine that generates one token per request per
step: ordering, weights, aging, counter lift, default tenant, cancellation, queue caps,
generated tokens charged while running, and the config errors of ``config check``."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from servehall.admission.scheduler import DEFAULT_TENANT, Ticket
from servehall.cli import build_cli
from servehall.config.models import SchedulerSettings, SchedulerTenantSettings
from servehall.config.settings import load_settings
from servehall.errors import ConfigError, QueueFullError, QueueTimeoutError
from servehall.plugin.manager import PluginHost
from servehall.schedulers import FairScheduler, FcfsScheduler, Grant, PriorityScheduler
from servehall.server.bootstrap import check_names


class FakeClock:
    """Monotonic seconds that move only when a test says so."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


async def settle() -> None:
    """Let every woken task run (handover → waiter task → engine registration)."""
    for _ in range(10):
        await asyncio.sleep(0)


@dataclass
class FakeRequest:
    name: str
    tenant: str | None
    prompt: int
    max_tokens: int
    generated: int = 0
    grant: Grant | None = None


@dataclass
class FakeEngine:
    """Admits through a scheduler; each :meth:`step` gives every running request one
    token and releases those that reached ``max_tokens``."""

    scheduler: Any
    running: list[FakeRequest] = field(default_factory=list)
    admitted: list[str] = field(default_factory=list)
    served: dict[str, int] = field(default_factory=dict)  # tenant -> prompt + generated
    tasks: list[asyncio.Task[None]] = field(default_factory=list)

    def submit(
        self,
        name: str,
        tenant: str | None,
        prompt: int = 10,
        max_tokens: int = 5,
        priority: int = 0,
    ) -> asyncio.Task[None]:
        req = FakeRequest(name, tenant, prompt, max_tokens)
        ticket = Ticket(
            request_id=name,
            model="m",
            tenant=tenant,
            priority=priority,
            prompt_tokens=prompt,
            cost_tokens=prompt + max_tokens,
        )

        async def run() -> None:
            grant = await self.scheduler.acquire(ticket)
            grant.track(lambda: req.generated)
            req.grant = grant
            self.admitted.append(name)
            key = tenant or DEFAULT_TENANT
            self.served[key] = self.served.get(key, 0) + prompt
            self.running.append(req)

        task = asyncio.ensure_future(run())
        self.tasks.append(task)
        return task

    async def step(self) -> None:
        for req in list(self.running):
            req.generated += 1
            key = req.tenant or DEFAULT_TENANT
            self.served[key] = self.served.get(key, 0) + 1
            if req.generated >= req.max_tokens:
                self.running.remove(req)
                assert req.grant is not None
                req.grant.release()
        await settle()

    async def drain(self, max_steps: int = 10_000) -> None:
        for _ in range(max_steps):
            if not self.running and all(t.done() for t in self.tasks):
                return
            await self.step()
        raise AssertionError("fake engine did not drain")


def _settings(**kw: Any) -> SchedulerSettings:
    return SchedulerSettings(**{"max_queue": 100, "queue_timeout_s": 60, **kw})


# --- priority ----------------------------------------------------------------------------


async def test_priority_higher_first_fcfs_within_a_level() -> None:
    clock = FakeClock()
    engine = FakeEngine(PriorityScheduler(_settings(max_concurrency=1, aging_s=0), clock=clock))
    engine.submit("hold", None, max_tokens=1)
    await settle()
    for name, prio in [("lo1", 0), ("hi1", 5), ("mid", 1), ("hi2", 5), ("lo2", 0)]:
        clock.now += 1
        engine.submit(name, None, max_tokens=1, priority=prio)
        await settle()
    assert engine.scheduler.waiting == 5
    await engine.drain()
    assert engine.admitted == ["hold", "hi1", "hi2", "mid", "lo1", "lo2"]


async def test_priority_aging_lets_low_priority_progress() -> None:
    clock = FakeClock()
    engine = FakeEngine(PriorityScheduler(_settings(max_concurrency=1, aging_s=10), clock=clock))
    engine.submit("hold", None, max_tokens=1)
    await settle()
    engine.submit("low@0", None, priority=0, max_tokens=1)
    await settle()
    clock.now = 5.0  # a level-1 request 5 s later ranks as if it came at -5 s: ahead
    engine.submit("high@5", None, priority=1, max_tokens=1)
    await settle()
    clock.now = 15.0  # 15 s later it ranks at 5 s: the aged low request goes first
    engine.submit("high@15", None, priority=1, max_tokens=1)
    await settle()
    clock.now = 25.0  # two levels up, 25 s later: ranks at 5 s too, after high@15
    engine.submit("top@25", None, priority=2, max_tokens=1)
    await settle()
    await engine.drain()
    assert engine.admitted == ["hold", "high@5", "low@0", "high@15", "top@25"]


async def test_priority_without_aging_starves_low_while_high_keeps_coming() -> None:
    clock = FakeClock()
    engine = FakeEngine(PriorityScheduler(_settings(max_concurrency=1, aging_s=0), clock=clock))
    engine.submit("hold", None, max_tokens=1)
    await settle()
    engine.submit("low", None, priority=0, max_tokens=1)
    await settle()
    for i in range(3):
        clock.now += 100
        engine.submit(f"high{i}", None, priority=1, max_tokens=1)
        await settle()
    await engine.drain()
    assert engine.admitted[-1] == "low"


async def test_priority_queue_time_uses_the_clock() -> None:
    clock = FakeClock()
    s = PriorityScheduler(_settings(max_concurrency=1), clock=clock)
    held = await s.acquire(Ticket("a", "m"))
    waiter = asyncio.ensure_future(s.acquire(Ticket("b", "m")))
    await settle()
    clock.now = 2.5
    held.release()
    grant = await waiter
    assert grant.queue_time_s == 2.5 and s.running == 1
    grant.release()
    assert s.running == 0 and s.waiting == 0


# --- fair (VTC) --------------------------------------------------------------------------


async def _backlogged(weights: dict[str, float], steps: int) -> tuple[FakeEngine, FairScheduler]:
    tenants = {t: {"weight": w} for t, w in weights.items()}
    s = FairScheduler(_settings(max_concurrency=2, tenants=tenants), clock=FakeClock())
    engine = FakeEngine(s)
    for i in range(40):
        for t in weights:
            engine.submit(f"{t}{i}", t, prompt=10, max_tokens=10)
    await settle()
    for _ in range(steps):
        await engine.step()
    return engine, s


async def test_fair_equal_weights_share_equally_within_the_vtc_bound() -> None:
    engine, s = await _backlogged({"a": 1, "b": 1}, steps=150)
    a, b = engine.served["a"], engine.served["b"]
    bound = 2 * (10 + 10)  # 2 × the largest request's cost (prompt + max_tokens)
    assert a > 100 and b > 100
    assert abs(a - b) <= bound
    states = s.tenant_states()
    assert states["a"].service_tokens == a and states["b"].service_tokens == b
    assert abs(s.counter("a") - s.counter("b")) <= bound
    for t in engine.tasks:
        t.cancel()
    await settle()
    assert s.waiting == 0


async def test_fair_weight_two_gets_twice_the_service() -> None:
    engine, _s = await _backlogged({"a": 2, "b": 1}, steps=300)
    a, b = engine.served["a"], engine.served["b"]
    assert 1.7 < a / b < 2.3
    assert abs(a / 2 - b) <= 2 * (10 + 10)  # the weighted gap stays within the bound
    for t in engine.tasks:
        t.cancel()
    await settle()


async def test_fcfs_gives_a_flooding_tenant_everything() -> None:
    # the baseline the fair policy is measured against (same workload)
    engine = FakeEngine(FcfsScheduler(_settings(max_concurrency=2)))
    for i in range(10):
        engine.submit(f"a{i}", "a", prompt=10, max_tokens=10)
    await settle()
    engine.submit("b0", "b", prompt=10, max_tokens=10)
    await settle()
    await engine.drain()
    assert engine.admitted.index("b0") == 10


async def test_fair_serves_a_newcomer_at_the_next_slot() -> None:
    engine = FakeEngine(FairScheduler(_settings(max_concurrency=2), clock=FakeClock()))
    for i in range(10):
        engine.submit(f"a{i}", "a", prompt=100, max_tokens=20)
    await settle()
    for _ in range(5):
        await engine.step()
    engine.submit("b0", "b", prompt=5, max_tokens=3)
    await settle()
    await engine.drain()
    # a0, a1 ran from the start; b0 takes the first slot that frees after it came
    assert engine.admitted[:3] == ["a0", "a1", "b0"]


async def test_fair_burst_slot_starts_a_newcomer_at_once() -> None:
    """With ``burst_slots = 1`` B's first request starts while A holds every slot;
    B's second waits (B runs its share, one of two slots); the slot above the cap is not handed over
    when a request ends, so the engine is back at ``max_concurrency`` after it."""
    sched = FairScheduler(_settings(max_concurrency=2, burst_slots=1), clock=FakeClock())
    engine = FakeEngine(sched)
    for i in range(6):
        engine.submit(f"a{i}", "a", prompt=100, max_tokens=20)
    await settle()
    await engine.step()
    engine.submit("b0", "b", prompt=5, max_tokens=3)
    await settle()
    assert engine.admitted == ["a0", "a1", "b0"] and sched.running == 3
    engine.submit("b1", "b", prompt=5, max_tokens=3)
    await settle()
    assert engine.admitted == ["a0", "a1", "b0"]  # b0 runs: B holds its share already
    peak = 0
    for _ in range(40):
        await engine.step()
        peak = max(peak, sched.running) if "b0" not in [r.name for r in engine.running] else 0
    # after b0 ended (its slot was the one above the cap), never more than the cap again
    assert peak <= 2 and sched.running <= 2
    await engine.drain()
    assert engine.admitted.index("b1") < engine.admitted.index("a5")
    assert sched.running == 0 and sched.waiting == 0


async def test_fair_burst_slot_lifts_a_busy_tenant_to_its_share() -> None:
    """Cap 4, ``burst_slots = 1``: A holds all 4 slots with a backlog. B's first request
    bursts (0 of its 2-slot share running). Once an A request ended (the total is back at
    the cap: 3 A + 1 B), B's second request bursts too (1 < 2). Once another A request
    ended, B's third waits in the queue (B runs its share) — unless B has weight 3: its
    share is then 3 slots, and the third bursts as well."""
    for weight, third_bursts in ((1.0, False), (3.0, True)):
        await _burst_to_share(weight, third_bursts)


async def _burst_to_share(weight: float, third_bursts: bool) -> None:
    tenants = {"b": SchedulerTenantSettings(weight=weight)}
    sched = FairScheduler(
        _settings(max_concurrency=4, burst_slots=1, tenants=tenants), clock=FakeClock()
    )
    engine = FakeEngine(sched)
    for i in range(8):  # A's requests end one step apart
        engine.submit(f"a{i}", "a", prompt=100, max_tokens=40 + i)
    await settle()
    assert sched.fair_share("b") == 4 * weight / (1 + weight)
    for name in ("b0", "b1"):
        engine.submit(name, "b", prompt=5, max_tokens=400)
        await settle()
        assert engine.admitted[-1] == name and sched.running == 5, name
        await _steps_until(engine, lambda: sched.running == 4)  # an A ended, not handed on
    assert [r.name[0] for r in engine.running].count("b") == 2
    engine.submit("b2", "b", prompt=5, max_tokens=400)
    await settle()
    assert ("b2" in engine.admitted) is third_bursts, weight
    assert sched.running == (5 if third_bursts else 4)
    await engine.drain()
    assert sched.running == 0 and sched.waiting == 0


async def _steps_until(engine: FakeEngine, pred: Callable[[], bool], limit: int = 500) -> None:
    for _ in range(limit):
        if pred():
            return
        await engine.step()
    raise AssertionError("the condition never held")


async def test_no_slot_above_the_cap_by_default_or_under_fcfs() -> None:
    for sched in (
        FairScheduler(_settings(max_concurrency=2), clock=FakeClock()),
        FcfsScheduler(_settings(max_concurrency=2, burst_slots=1), clock=FakeClock()),
    ):
        engine = FakeEngine(sched)
        for i in range(4):
            engine.submit(f"a{i}", "a", prompt=100, max_tokens=20)
        await settle()
        engine.submit("b0", "b", prompt=5, max_tokens=3)
        await settle()
        assert engine.admitted == ["a0", "a1"] and sched.running == 2, sched.name
        await engine.drain()


async def test_fair_counter_lift_gives_no_credit_for_idling() -> None:
    clock = FakeClock()
    s = FairScheduler(_settings(max_concurrency=1), clock=clock)
    engine = FakeEngine(s)
    # a is served alone for a while: its counter grows
    for i in range(6):
        engine.submit(f"a{i}", "a", prompt=10, max_tokens=10)
    await settle()
    for _ in range(30):
        await engine.step()
    a_counter = s.counter("a")
    assert a_counter >= 60 and s.counter("b") == 0
    # b arrives while a is backlogged: lifted to a's counter, not left at 0
    engine.submit("b0", "b", prompt=10, max_tokens=10)
    engine.submit("b1", "b", prompt=10, max_tokens=10)
    engine.submit("b2", "b", prompt=10, max_tokens=10)
    await settle()
    assert s.counter("b") >= a_counter
    await engine.drain()
    # b goes first at the next slot, then they alternate; without the lift b (counter 0)
    # would take every slot until it caught up with a's 70 tokens
    assert engine.admitted[4:] == ["b0", "a4", "b1", "a5", "b2"], engine.admitted


async def test_fair_lift_from_the_last_tenant_when_the_queue_is_empty() -> None:
    s = FairScheduler(_settings(max_concurrency=1), clock=FakeClock())
    engine = FakeEngine(s)
    engine.submit("a0", "a", prompt=10, max_tokens=10)
    engine.submit("a1", "a", prompt=10, max_tokens=10)
    await settle()
    for _ in range(10):
        await engine.step()  # a0 done, a1 admitted: a has left the queue
    assert s.waiting == 0
    engine.submit("b0", "b", prompt=10, max_tokens=10)
    await settle()
    assert s.counter("b") == s.counter("a")
    await engine.drain()


async def test_fair_default_tenant_is_shared() -> None:
    s = FairScheduler(_settings(max_concurrency=1), clock=FakeClock())
    engine = FakeEngine(s)
    engine.submit("x", None, prompt=3, max_tokens=2)
    engine.submit("y", None, prompt=4, max_tokens=2)
    await settle()
    await engine.drain()
    states = s.tenant_states()
    assert list(states) == [DEFAULT_TENANT]
    assert states[DEFAULT_TENANT].service_tokens == 3 + 2 + 4 + 2


async def test_generated_tokens_are_charged_while_the_request_runs() -> None:
    s = FairScheduler(_settings(max_concurrency=1, tenants={"a": {"weight": 2}}))
    generated = 0
    grant = await s.acquire(Ticket("r", "m", tenant="a", prompt_tokens=100))
    grant.track(lambda: generated)
    assert s.counter("a") == 50  # prompt / weight
    generated = 40
    st = s.tenant_states()["a"]  # a scrape reads the progress: no per-token call
    assert st.service_tokens == 140 and st.virtual_tokens == 70 and st.running == 1
    generated = 60
    grant.release()
    assert s.counter("a") == 80 and s.tenant_states()["a"].service_tokens == 160


@pytest.mark.parametrize("policy", [FcfsScheduler, PriorityScheduler, FairScheduler])
async def test_cancelled_waiter_leaves_the_queue(policy: type[Any]) -> None:
    s = policy(_settings(max_concurrency=1))
    held = await s.acquire(Ticket("h", "m", tenant="a"))
    gone = asyncio.ensure_future(s.acquire(Ticket("gone", "m", tenant="b")))
    stays = asyncio.ensure_future(s.acquire(Ticket("stays", "m", tenant="c")))
    await settle()
    assert s.waiting == 2 and s.tenant_states()["b"].waiting == 1
    gone.cancel()
    await settle()
    assert gone.cancelled() and s.waiting == 1 and "b" not in s.tenant_states()
    held.release()
    grant = await stays
    assert grant.ticket.request_id == "stays" and s.running == 1
    grant.release()
    assert s.running == 0 and s.waiting == 0


@pytest.mark.parametrize("policy", [FcfsScheduler, PriorityScheduler, FairScheduler])
async def test_queue_caps_and_timeout(policy: type[Any]) -> None:
    s = policy(_settings(max_concurrency=1, max_queue=3, max_queue_per_tenant=2))
    held = await s.acquire(Ticket("h", "m", tenant="a"))
    waiters = [asyncio.ensure_future(s.acquire(Ticket(f"a{i}", "m", tenant="a"))) for i in (1, 2)]
    await settle()
    with pytest.raises(QueueFullError) as err:  # a's own cap
        await s.acquire(Ticket("a3", "m", tenant="a"))
    assert err.value.status == 503 and err.value.headers["Retry-After"] == "1"
    b = asyncio.ensure_future(s.acquire(Ticket("b1", "m", tenant="b")))
    await settle()
    assert s.waiting == 3
    with pytest.raises(QueueFullError):  # the global cap
        await s.acquire(Ticket("c1", "m", tenant="c"))
    for w in [*waiters, b]:
        w.cancel()
    await settle()
    s.settings = _settings(max_concurrency=1, queue_timeout_s=0.01)
    with pytest.raises(QueueTimeoutError) as tout:
        await s.acquire(Ticket("late", "m", tenant="b"))
    assert tout.value.headers["Retry-After"] == "1" and s.waiting == 0
    held.release()
    assert s.running == 0


async def test_a_tenant_section_overrides_the_per_tenant_cap() -> None:
    s = FairScheduler(
        _settings(max_concurrency=1, max_queue_per_tenant=1, tenants={"big": {"max_queue": 3}})
    )
    held = await s.acquire(Ticket("h", "m", tenant="x"))
    big = [asyncio.ensure_future(s.acquire(Ticket(f"b{i}", "m", tenant="big"))) for i in range(3)]
    small = asyncio.ensure_future(s.acquire(Ticket("s0", "m", tenant="small")))
    await settle()
    assert s.waiting == 4
    with pytest.raises(QueueFullError):
        await s.acquire(Ticket("s1", "m", tenant="small"))
    with pytest.raises(QueueFullError):
        await s.acquire(Ticket("b3", "m", tenant="big"))
    for w in [*big, small]:
        w.cancel()
    await settle()
    held.release()


# --- config check ------------------------------------------------------------------------


def _check(scheduler: dict[str, Any]) -> list[tuple[str, str]]:
    try:
        settings = load_settings(data={"scheduler": scheduler})
        check_names(settings, PluginHost([]))
    except ConfigError as exc:
        return list(exc.errors)
    return []


def test_config_errors_name_their_key_path() -> None:
    assert _check({"policy": "fair", "tenants": {"a": {"weight": 2, "max_queue": 4}}}) == []
    assert _check({"policy": "priority", "tenants": {"a": {"max_queue": 4}}}) == []
    errs = _check({"policy": "lottery"})
    assert errs[0][0] == "scheduler.policy" and "fair" in errs[0][1] and "priority" in errs[0][1]
    for weight in (0, -1):
        errs = _check({"policy": "fair", "tenants": {"a": {"weight": weight}}})
        assert errs[0][0] == "scheduler.tenants.a.weight"
    errs = _check({"policy": "fcfs", "tenants": {"a": {"weight": 2}}})
    assert errs == [("scheduler.tenants.a", "policy 'fcfs' has no tenant settings")]
    errs = _check({"policy": "priority", "tenants": {"a": {"weight": 2}}})
    assert errs[0][0] == "scheduler.tenants.a.weight" and "priority" in errs[0][1]
    errs = _check({"policy": "fair", "tenants": {"a": {"wieght": 2}}})
    assert errs[0][0] == "scheduler.tenants.a.wieght"
    assert _check({"policy": "fair", "burst_slots": 1}) == []
    assert _check({"policy": "priority", "aging_s": 5}) == []
    errs = _check({"policy": "fcfs", "burst_slots": 1})
    assert errs == [("scheduler.burst_slots", "not used by policy 'fcfs' (it reads: none)")]
    errs = _check({"policy": "fair", "aging_s": 5})
    assert errs == [("scheduler.aging_s", "not used by policy 'fair' (it reads: burst_slots)")]
    errs = _check({"policy": "fair", "burst_slots": -1})
    assert errs[0][0] == "scheduler.burst_slots"


def test_config_check_command_reports_scheduler_errors(tmp_path: Path) -> None:
    cfg = tmp_path / "sched.toml"
    cfg.write_text('[scheduler]\npolicy = "fcfs"\n[scheduler.tenants.acme]\nweight = 2\n')
    res = CliRunner().invoke(build_cli([]), ["config", "check", str(cfg)])
    assert res.exit_code == 1 and "scheduler.tenants.acme" in res.output
    cfg.write_text('[scheduler]\npolicy = "fair"\n[scheduler.tenants.acme]\nweight = 0\n')
    res = CliRunner().invoke(build_cli([]), ["config", "check", str(cfg)])
    assert res.exit_code == 1 and "scheduler.tenants.acme.weight" in res.output
    cfg.write_text('[scheduler]\npolicy = "fair"\n[scheduler.tenants.acme]\nweight = 2.5\n')
    res = CliRunner().invoke(build_cli([]), ["config", "check", str(cfg)])
    assert res.exit_code == 0, res.output
