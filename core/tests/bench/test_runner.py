"""Tests of servehall.bench.runner: sending a workload through a real async sender —
results in workload order, arrival offsets honoured, the concurrency cap, a failing
request recorded without ending the run, progress per request."""

from __future__ import annotations

import asyncio
import time

import pytest

from servehall.bench.metrics import RequestOutput
from servehall.bench.runner import run_workload
from servehall.bench.workload import BenchRequest

REQS = [BenchRequest(f"p{i}", i + 1, 4) for i in range(6)]


class Sender:
    """Sleeps ``delay`` per request; records concurrency and send times."""

    def __init__(self, delay: float = 0.02, fail_on: str | None = None) -> None:
        self.delay = delay
        self.fail_on = fail_on
        self.in_flight = 0
        self.peak = 0
        self.sent: dict[str, float] = {}

    async def __call__(self, req: BenchRequest, t0: float) -> RequestOutput:
        self.sent[req.prompt] = time.perf_counter() - t0
        if req.prompt == self.fail_on:
            raise RuntimeError("connection refused\nsecond line")
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        await asyncio.sleep(self.delay)
        self.in_flight -= 1
        return RequestOutput(success=True, prompt_tokens=req.prompt_len, output_tokens=4)


async def test_outputs_in_workload_order_all_at_once() -> None:
    send = Sender()
    result = await run_workload(REQS, send)
    assert [o.prompt_tokens for o in result.outputs] == [1, 2, 3, 4, 5, 6]
    assert send.peak == 6  # unbounded
    assert 0.02 <= result.duration_s < 1


async def test_concurrency_cap() -> None:
    send = Sender(delay=0.03)
    result = await run_workload(REQS, send, max_concurrency=2)
    assert send.peak == 2 and len(result.outputs) == 6
    assert result.duration_s >= 3 * 0.03  # three waves of two


async def test_offsets_are_arrival_times() -> None:
    send = Sender(delay=0.0)
    offsets = [0.0, 0.0, 0.05, 0.05, 0.1, 0.1]
    await run_workload(REQS, send, offsets=offsets)
    for req, off in zip(REQS, offsets, strict=True):
        assert off <= send.sent[req.prompt] < off + 0.2


async def test_a_failing_request_is_recorded_and_the_run_goes_on() -> None:
    seen: list[RequestOutput] = []
    result = await run_workload(REQS, Sender(fail_on="p2"), progress=seen.append)
    failed = result.outputs[2]
    assert not failed.success and failed.error == "RuntimeError: connection refused"
    assert sum(o.success for o in result.outputs) == 5
    assert len(seen) == 6


async def test_offsets_must_match_the_requests() -> None:
    with pytest.raises(ValueError, match="differ in length"):
        await run_workload(REQS, Sender(), offsets=[0.0])


async def test_empty_workload() -> None:
    result = await run_workload([], Sender())
    assert result.outputs == [] and result.duration_s > 0
