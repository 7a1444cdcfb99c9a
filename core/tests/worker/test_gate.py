"""``servehall.worker.gate.EngineGate``: while a model's worker restarts, a request waits
(counted as waiting, its wait in its queue time), then runs — or gets a 503 naming the
reason; never hangs. The inner policy is the real FCFS scheduler."""

from __future__ import annotations

import asyncio

import pytest

from servehall.admission.scheduler import Ticket
from servehall.config.models import SchedulerSettings
from servehall.errors import EngineUnavailableError
from servehall.schedulers.fcfs import FcfsScheduler
from servehall.worker.gate import EngineGate


class _Engine:
    """The gate's view of an engine (``Restartable``): up, or down until :meth:`up`."""

    def __init__(self, up: bool) -> None:
        self._up = asyncio.Event()
        if up:
            self._up.set()
        self.state_reason = "restarting after a crash (attempt 2)"

    @property
    def worker_up(self) -> bool:
        return self._up.is_set()

    def up(self) -> None:
        self._up.set()

    async def wait_up(self, timeout: float) -> bool:
        try:
            await asyncio.wait_for(self._up.wait(), timeout)
        except TimeoutError:
            return False
        return True


def _gate(engine: _Engine, timeout_s: float = 5.0) -> EngineGate:
    settings = SchedulerSettings(queue_timeout_s=timeout_s, retry_after_s=7, max_concurrency=2)
    return EngineGate(FcfsScheduler(settings), engine, "tiny", settings)


def _ticket() -> Ticket:
    return Ticket(request_id="r", model="tiny")


async def test_an_up_engine_adds_nothing() -> None:
    gate = _gate(_Engine(up=True))
    assert gate.name == "fcfs"
    slot = await gate.acquire(_ticket())
    assert gate.running == 1 and gate.waiting == 0
    slot.release()
    assert gate.running == 0


async def test_a_request_waits_for_the_worker_and_counts_as_waiting() -> None:
    engine = _Engine(up=False)
    gate = _gate(engine)
    task = asyncio.ensure_future(gate.acquire(_ticket()))
    await asyncio.sleep(0.05)
    assert not task.done() and gate.waiting == 1
    engine.up()
    slot = await asyncio.wait_for(task, 2)
    assert gate.waiting == 0 and gate.running == 1
    assert slot.queue_time_s >= 0.04  # the wait counts in the queue time
    slot.release()


async def test_a_worker_not_back_in_time_is_a_503_with_retry_after() -> None:
    gate = _gate(_Engine(up=False), timeout_s=0.05)
    with pytest.raises(EngineUnavailableError) as err:
        await gate.acquire(_ticket())
    assert "model 'tiny' is unavailable: restarting after a crash" in str(err.value)
    assert err.value.headers["Retry-After"] == "7"
    assert err.value.status == 503
    assert gate.waiting == 0


async def test_other_attributes_are_the_policys() -> None:
    gate = _gate(_Engine(up=True))
    assert gate.tenant_states() == gate.inner.tenant_states()  # type: ignore[attr-defined]
