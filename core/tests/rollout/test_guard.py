"""The canary guard (:mod:`servehall.rollout.guard`): its judgement, its figures, and
that every outcome of a canary's traffic counts — refusals before admission too."""

from __future__ import annotations

import asyncio
import dataclasses
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).parents[1]))
from api_fixtures import Records, ScriptedEngine, make_host
from text_fixtures import build_tokenizer

from servehall.api.app import create_app
from servehall.config.models import RollbackIf, RolledBack, SchedulerSettings
from servehall.errors import ServiceUnavailableError
from servehall.plugin.host import Host
from servehall.plugin.outcomes import OutcomeWindow
from servehall.records.types import AuditEvent
from servehall.rollout.guard import breach, observe, p99
from servehall.schedulers.fcfs import FcfsScheduler


def _window(n: int, errors: int = 0, ttft: float = 0.1, at: float = 100.0) -> OutcomeWindow:
    w = OutcomeWindow(60)
    for i in range(n):
        w.add(at, i < errors, ttft)
    return w


def test_error_rate_breach_needs_min_requests() -> None:
    rule = RollbackIf(error_rate_above=0.02, min_requests=50)
    assert breach(rule, _window(49, errors=49), []) is None  # too few to judge
    found = breach(rule, _window(50, errors=2), [])
    assert found is not None and found.reason == "error_rate"
    assert breach(rule, _window(50, errors=1), []) is None  # 0.02 is not above 0.02


def test_ttft_p99_against_the_baseline() -> None:
    rule = RollbackIf(ttft_p99_above_baseline=1.5, min_requests=20)
    base = [_window(40, ttft=0.1)]
    assert breach(rule, _window(20, ttft=0.14), base) is None
    found = breach(rule, _window(20, ttft=0.2), base)
    assert found is not None and found.reason == "ttft_p99" and "baseline 100.0 ms" in found.detail
    assert breach(rule, _window(20, ttft=0.2), [_window(5, ttft=0.1)]) is None  # thin baseline


def test_window_slides() -> None:
    w = OutcomeWindow(10)
    w.add(0.0, True, None)
    w.add(5.0, False, 0.1)
    assert w.count == 2 and w.error_rate() == 0.5
    w.add(10.5, False, 0.1)
    assert w.count == 2 and w.error_rate() == 0.0


def test_p99_nearest_rank() -> None:
    assert p99([]) is None
    assert p99([float(i) for i in range(1, 101)]) == 99.0
    assert p99([3.0]) == 3.0


# --- the breach's figures, and who may be rolled back -------------------------------------


def test_breach_carries_the_figures_it_was_judged_on() -> None:
    rule = RollbackIf(error_rate_above=0.1, min_requests=10, window_s=60)
    found = breach(rule, _window(10, errors=5), [])
    assert found is not None
    assert found.figures == {
        "requests": 10,
        "errors": 5,
        "error_rate": 0.5,
        "window_s": 60,
        "min_requests": 10,
        "error_rate_above": 0.1,
    }
    ttft = RollbackIf(ttft_p99_above_baseline=1.5, min_requests=20)
    slow = breach(ttft, _window(20, ttft=0.2), [_window(40, ttft=0.1)])
    assert slow is not None and slow.reason == "ttft_p99"
    assert slow.figures["ttft_p99_ms"] == 200.0 and slow.figures["baseline_ttft_p99_ms"] == 100.0
    assert slow.figures["baseline_requests"] == 40
    marker = slow.marker("replica-1")
    assert marker["reason"] == "ttft_p99" and marker["by"] == "replica-1"
    RolledBack(weight=10, **marker)  # the config's rolled_back table accepts it


# --- every outcome of the canary's traffic counts (in process, a scripted engine) --------


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tokenizer(tmp_path_factory.mktemp("tok"))


class RefusingRecords(Records):
    """The record bus while a required sink cannot write: admission is refused (503
    ``records_unavailable``), as :meth:`servehall.records.bus.RecordBus.check_admission`
    refuses it."""

    def __init__(self) -> None:
        super().__init__()
        self.refusing = False
        self.events: list[AuditEvent] = []

    def check_admission(self) -> None:
        if self.refusing:
            raise ServiceUnavailableError("no", code="records_unavailable")

    def audit(self, event: Any) -> None:
        self.events.append(event)


def _versions_host(tok_dir: Path, canary_queue: int = 256) -> tuple[Host, RefusingRecords]:
    """``m@a`` (weight 1) and the guarded canary ``m@c`` (weight 1; its scheduler runs one
    request and queues ``canary_queue``), on a slow scripted engine."""
    from servehall.text import load_tokenizer

    ids = load_tokenizer(tok_dir).encode_plain(" the quick brown fox")
    host = make_host(tok_dir, ScriptedEngine(ids, step_s=0.05))
    base = host.models.pop("m")
    rule = RollbackIf(error_rate_above=0.5, min_requests=4, window_s=60)
    one = SchedulerSettings(max_concurrency=1, max_queue=canary_queue)
    host.models["m@a"] = dataclasses.replace(base, version="a", weight=1.0)
    host.models["m@c"] = dataclasses.replace(
        base,
        version="c",
        weight=1.0,
        rollback_if=rule,
        scheduler=FcfsScheduler(one),
        outcomes=OutcomeWindow(60),
    )
    records = RefusingRecords()
    host.records = records
    return host, records


PIN_C = {"x-servehall-model-version": "c"}


async def _pinned(c: httpx.AsyncClient, max_tokens: int = 2) -> int:
    body = {"model": "m", "prompt": "hi", "max_tokens": max_tokens}
    return (await c.post("/v1/completions", json=body, headers=PIN_C)).status_code


async def test_queue_full_refusals_of_the_canary_roll_it_back(tok_dir: Path) -> None:
    host, records = _versions_host(tok_dir, canary_queue=0)
    canary = host.models["m@c"]
    app = create_app(host)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
        holder = asyncio.ensure_future(_pinned(c, max_tokens=40))  # holds the only slot
        while not host.models["m@c"].engine.live:  # type: ignore[attr-defined]
            await asyncio.sleep(0.01)
        refused = [await _pinned(c) for _ in range(4)]
        await asyncio.sleep(1.05)  # the guard judges at most once a second
        refused.append(await _pinned(c))
        assert refused == [503] * 5  # queue_full, before admission
        assert canary.weight == 0.0, "refusals before admission were not counted"
        assert await holder == 200
    assert [e.action for e in records.events] == ["model.canary_rollback"]
    details = records.events[0].details
    assert details["reason"] == "error_rate" and details["requests"] >= 4
    assert details["errors"] == 5 and host.models["m@a"].weight == 1.0


async def test_records_unavailable_refusals_count_and_4xx_do_not(tok_dir: Path) -> None:
    host, records = _versions_host(tok_dir)
    canary = host.models["m@c"]
    app = create_app(host)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
        bad = {"model": "m", "prompt": "hi", "max_tokens": 2, "n": 9}  # [server] max_n = 8
        for _ in range(6):  # a client error on the canary: counted, not an error
            r = await c.post("/v1/completions", json=bad, headers=PIN_C)
            assert r.status_code == 400
        assert canary.outcomes.count == 6 and canary.outcomes.errors() == 0
        assert canary.weight == 1.0
        records.refusing = True
        for _ in range(8):
            assert await _pinned(c) == 503
        records.refusing = False
        await asyncio.sleep(1.05)  # the guard judges at most once a second
        assert await _pinned(c) == 200  # 8 errors in 15: above 0.5
    assert canary.outcomes.errors() == 8
    assert canary.weight == 0.0
    assert [e.action for e in records.events] == ["model.canary_rollback"]


async def test_the_last_weighted_version_is_never_rolled_back(tok_dir: Path) -> None:
    host, records = _versions_host(tok_dir)
    host.models["m@a"].weight = 0.0
    canary = host.models["m@c"]
    for _ in range(10):
        observe(host, None, canary, True, None)
    assert canary.weight == 1.0 and records.events == []
