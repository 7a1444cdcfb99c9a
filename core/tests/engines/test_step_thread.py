"""Tests of servehall.engines.step_thread: the step-thread engine skeleton, driven by a
small real subclass (a counting "library" whose step emits the next integer for every
request in flight) on a real thread and event loop."""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any

import pytest

from servehall import EngineError, SamplingParams, TokenDelta
from servehall.engines.kit import DeltaStream
from servehall.engines.step_thread import StepThreadEngine


class CountingEngine(StepThreadEngine):
    """Each step gives every admitted request the next integer after its last token."""

    def __init__(self, *, fail_at: int | None = None) -> None:
        super().__init__("counter", label="counting", library="Counter", log=logging.getLogger("t"))
        self.live: dict[str, list[Any]] = {}  # step thread: rid -> [stream, next, left]
        self.cancelled: list[str] = []
        self.closed: list[str] | None = None
        self.fail_at = fail_at
        self.step_threads: set[str] = set()

    async def start(self) -> None:
        self._loop = self._streams.loop = asyncio.get_running_loop()
        self._thread = threading.Thread(target=self.step_loop, name="count-step", daemon=True)
        self._started = True
        self._thread.start()

    def _add_command(self, stream: DeltaStream, prompt: list[int], params: SamplingParams) -> Any:
        if params.temperature > 1.5:
            raise ValueError("temperature too high for the counter")
        return stream, prompt[-1] + 1, params.max_tokens

    def _admit(self, command: Any) -> None:
        stream, start, left = command
        if not stream.done:
            self.live[stream.request_id] = [stream, start, left]

    def _cancel(self, stream: DeltaStream) -> None:
        self.cancelled.append(stream.request_id)
        self.live.pop(stream.request_id, None)

    def _busy(self) -> bool:
        return bool(self.live)

    def _step(self) -> list[tuple[DeltaStream, TokenDelta]]:
        self.step_threads.add(threading.current_thread().name)
        out = []
        for rid, entry in list(self.live.items()):
            stream, token, left = entry
            if token == self.fail_at:
                raise OSError(f"device lost at token {token}")
            entry[1], entry[2] = token + 1, left - 1
            finish = "length" if left == 1 else None
            if finish:
                del self.live[rid]
            out.append((stream, TokenDelta((token,), finish)))
        return out

    def _close_live(self) -> None:
        self.closed = sorted(self.live)
        self.live.clear()


async def _collect(stream: DeltaStream) -> list[TokenDelta]:
    return [d async for d in stream]


def _tokens(deltas: list[TokenDelta]) -> list[int]:
    return [t for d in deltas for t in d.token_ids]


@pytest.fixture
async def engine() -> Any:
    eng = CountingEngine()
    await eng.start()
    yield eng
    await eng.shutdown()


async def test_requests_run_concurrently_on_the_step_thread(engine: CountingEngine) -> None:
    a = engine.add_request("a", [1, 10], SamplingParams(3))
    b = engine.add_request("b", [100], SamplingParams(2))
    da, db = await asyncio.wait_for(asyncio.gather(_collect(a), _collect(b)), 10)
    assert _tokens(da) == [11, 12, 13] and da[-1].finish_reason == "length"
    assert _tokens(db) == [101, 102] and db[-1].finish_reason == "length"
    assert engine.step_threads == {"count-step"}
    assert "a" not in engine._streams and "b" not in engine._streams  # forgotten when done


async def test_health_through_the_lifecycle() -> None:
    eng = CountingEngine()
    assert (await eng.health()).reason == "engine not started"
    with pytest.raises(EngineError, match="counting engine is not running"):
        eng.add_request("x", [1], SamplingParams(1))
    await eng.start()
    assert (await eng.health()).ok
    await eng.shutdown()
    health = await eng.health()
    assert not health.ok and health.reason == "engine is shut down"
    assert eng._thread is not None and not eng._thread.is_alive()
    with pytest.raises(EngineError, match="not running"):
        eng.add_request("y", [1], SamplingParams(1))
    await eng.shutdown()  # idempotent


async def test_bad_requests_end_at_once(engine: CountingEngine) -> None:
    empty = await _collect(engine.add_request("e", [], SamplingParams(1)))
    assert [(d.finish_reason, d.error) for d in empty] == [("error", "empty prompt")]
    bad = await _collect(engine.add_request("t", [1], SamplingParams(1, temperature=2.0)))
    assert bad[-1].finish_reason == "error"
    assert bad[-1].error == "invalid sampling parameters: temperature too high for the counter"
    assert "e" not in engine._streams and "t" not in engine._streams
    # the ids are free again
    ok = await asyncio.wait_for(_collect(engine.add_request("e", [1], SamplingParams(1))), 10)
    assert _tokens(ok) == [2]


async def test_duplicate_live_id_is_a_value_error(engine: CountingEngine) -> None:
    engine.add_request("d", [1], SamplingParams(10_000))
    with pytest.raises(ValueError, match="'d' is already live"):
        engine.add_request("d", [1], SamplingParams(1))


async def test_abort_ends_the_stream_and_cancels_on_the_step_thread(
    engine: CountingEngine,
) -> None:
    stream = engine.add_request("long", [0], SamplingParams(1_000_000))
    first = await asyncio.wait_for(anext(stream), 10)
    assert first.token_ids
    await engine.abort("long")
    rest = await asyncio.wait_for(_collect(stream), 10)
    assert rest[-1].finish_reason == "abort"
    for _ in range(200):
        if engine.cancelled:
            break
        await asyncio.sleep(0.01)
    assert engine.cancelled == ["long"]
    await engine.abort("long")  # unknown now: no-op
    await engine.abort("never-was")
    assert engine.cancelled == ["long"]


async def test_shutdown_aborts_live_streams_and_closes_the_rest() -> None:
    eng = CountingEngine()
    await eng.start()
    stream = eng.add_request("live", [0], SamplingParams(1_000_000))
    await asyncio.wait_for(anext(stream), 10)
    await eng.shutdown()
    rest = await asyncio.wait_for(_collect(stream), 10)
    assert rest[-1].finish_reason == "abort"
    assert eng.closed == []  # the abort was applied before "stop"


async def test_a_failed_step_kills_the_engine_and_fails_live_streams(
    caplog: pytest.LogCaptureFixture,
) -> None:
    eng = CountingEngine(fail_at=5)
    await eng.start()
    try:
        stream = eng.add_request("f", [1], SamplingParams(100))
        deltas = await asyncio.wait_for(_collect(stream), 10)
        assert _tokens(deltas) == [2, 3, 4]
        assert deltas[-1].finish_reason == "error" and deltas[-1].error == "engine step failed"
        for _ in range(200):
            if not (await eng.health()).ok and eng.closed is not None:
                break
            await asyncio.sleep(0.01)
        health = await eng.health()
        assert health.reason == "Counter step failed: OSError: device lost at token 5"
        assert eng.closed == ["f"]  # _close_live ran on the way out
        assert "model counter: Counter step failed" in caplog.text
        after = await _collect(eng.add_request("g", [1], SamplingParams(1)))
        assert [(d.finish_reason, d.error) for d in after] == [("error", "engine is not healthy")]
    finally:
        await eng.shutdown()


async def test_injected_fault_fails_the_next_step(engine: CountingEngine) -> None:
    engine._inject_fault("boom")
    for _ in range(300):
        if not (await engine.health()).ok:
            break
        await asyncio.sleep(0.01)
    assert (await engine.health()).reason == "Counter step failed: RuntimeError: boom"


async def test_step_sink_gets_pairs_on_the_step_thread(engine: CountingEngine) -> None:
    got: list[tuple[str, str, TokenDelta]] = []
    done = asyncio.Event()
    loop = asyncio.get_running_loop()

    def sink(pairs: list[tuple[str, TokenDelta]]) -> None:
        for rid, delta in pairs:
            got.append((threading.current_thread().name, rid, delta))
            if delta.finish_reason:
                loop.call_soon_threadsafe(done.set)

    engine.set_step_sink(sink)
    engine.add_request("s", [7], SamplingParams(2))
    await asyncio.wait_for(done.wait(), 10)
    assert [(n, r, d.token_ids) for n, r, d in got] == [
        ("count-step", "s", (8,)),
        ("count-step", "s", (9,)),
    ]
    for _ in range(100):
        if "s" not in engine._streams:
            break
        await asyncio.sleep(0.01)
    assert "s" not in engine._streams  # the loop forgot the finished request
