"""``servehall.engines.embedbatch``: the embedding engines' shared queue (calls that
arrive during a pass share the next), pass splitting and the refusal stream."""

from __future__ import annotations

import asyncio
import logging
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from servehall.engines.embedbatch import EmbedBatcher, padded_passes, refuse_generation
from servehall.errors import EngineError, EngineUnavailableError

log = logging.getLogger("test.embedbatch")


def test_padded_passes_respect_the_budget() -> None:
    assert padded_passes([], 8) == []
    assert padded_passes([[1], [1, 2], [1, 2, 3]], 100) == [(0, 3, 3)]
    # 2 x 3 = 6 fits 6; adding a third input (3 x 3 = 9) does not
    assert padded_passes([[1, 2, 3], [1], [1]], 6) == [(0, 2, 3), (2, 3, 1)]
    # an input longer than the budget is a pass of its own
    assert padded_passes([[1] * 10, [1]], 4) == [(0, 1, 10), (1, 2, 1)]


async def test_calls_during_a_pass_share_the_next() -> None:
    gate = threading.Event()
    passes: list[list[list[int]]] = []

    def forward(inputs: list[list[int]]) -> list[list[float]]:
        passes.append(inputs)
        if len(passes) == 1:
            gate.wait(10)
        return [[float(sum(x))] for x in inputs]

    with ThreadPoolExecutor(1) as pool:
        b = EmbedBatcher("m", pool, forward, log)
        first = asyncio.ensure_future(b.embed([[1, 2]]))
        while not passes:
            await asyncio.sleep(0.01)
        assert b.running == 1
        second = asyncio.ensure_future(b.embed([[3], [4, 5]]))
        third = asyncio.ensure_future(b.embed([[6]]))
        await asyncio.sleep(0.05)
        assert b.waiting == 2
        gate.set()
        assert await first == [[3.0]]
        assert await second == [[3.0], [9.0]] and await third == [[6.0]]
        assert passes == [[[1, 2]], [[3], [4, 5], [6]]]
        assert (b.running, b.waiting) == (0, 0)
        assert await b.embed([]) == []
        await b.close()
        with pytest.raises(EngineUnavailableError):
            await b.embed([[1]])


async def test_a_failed_pass_fails_its_calls_only() -> None:
    def forward(inputs: list[list[int]]) -> list[list[float]]:
        if inputs == [[0]]:
            raise RuntimeError("boom")
        return [[1.0] for _ in inputs]

    with ThreadPoolExecutor(1) as pool:
        b = EmbedBatcher("m", pool, forward, log)
        with pytest.raises(EngineError, match="RuntimeError: boom"):
            await b.embed([[0]])
        assert await b.embed([[1]]) == [[1.0]]
        await b.close()


async def test_close_fails_queued_calls() -> None:
    gate = threading.Event()

    def forward(inputs: list[list[int]]) -> list[list[float]]:
        gate.wait(10)
        return [[1.0] for _ in inputs]

    with ThreadPoolExecutor(1) as pool:
        b = EmbedBatcher("m", pool, forward, log)
        running = asyncio.ensure_future(b.embed([[1]]))
        await asyncio.sleep(0.05)
        queued = asyncio.ensure_future(b.embed([[2]]))
        await asyncio.sleep(0)
        closing = asyncio.ensure_future(b.close())
        await asyncio.sleep(0.05)
        gate.set()
        await closing
        assert await running == [[1.0]]  # the pass in flight finishes
        with pytest.raises(EngineUnavailableError):
            await queued


async def test_refuse_generation() -> None:
    stream = refuse_generation("mini", "r1")
    deltas = [d async for d in stream]
    assert len(deltas) == 1 and deltas[0].finish_reason == "error"
    assert deltas[0].code == "invalid_request" and "'mini'" in (deltas[0].error or "")
