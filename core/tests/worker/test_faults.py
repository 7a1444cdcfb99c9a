"""The worker's test fault hook (:mod:`servehall.worker.faults`): which generation a
fault applies to, and what each kind does to the serve loop."""

from __future__ import annotations

import asyncio
import time

import pytest

from servehall.worker.faults import (
    EXIT_FAULT,
    FAULT_ENV,
    STALL_LOOP_S,
    WEDGE_LOOP_S,
    FaultHook,
    parse_fault,
)


def test_fault_hook_parser() -> None:
    assert parse_fault(None, 1) is None
    assert parse_fault("hang_step", 1) == "hang_step"
    assert parse_fault("hang_step", 2) is None
    assert parse_fault("exit_after_ready@2+", 1) is None
    assert parse_fault("exit_after_ready@2+", 3) == "exit_after_ready"
    assert parse_fault("x@2", 2) == "x" and parse_fault("x@2", 3) is None


def test_the_hook_reads_its_generation_s_fault_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(FAULT_ENV, raising=False)
    assert FaultHook.from_env(1).kind is None
    monkeypatch.setenv(FAULT_ENV, "exit_after_ready@2+")
    assert FaultHook.from_env(1).kind is None
    assert FaultHook.from_env(2).kind == "exit_after_ready"
    assert EXIT_FAULT == 7


def test_no_fault_does_nothing() -> None:
    hook = FaultHook(None)
    assert not hook.exit_after_ready()
    hook.after_step(None)  # no loop needed when nothing happens
    assert not hook.hung and hook.kind is None


def test_exit_after_ready_and_hang_step() -> None:
    assert FaultHook("exit_after_ready").exit_after_ready()
    assert not FaultHook("hang_step").exit_after_ready()
    hook = FaultHook("hang_step")
    assert not hook.hung
    hook.after_step(None)
    assert hook.hung
    hook.after_step(None)  # stays hung
    assert hook.hung and hook.kind == "hang_step"


class _Loop:
    """Records what the hook schedules on the event loop."""

    def __init__(self) -> None:
        self.calls: list[tuple[object, ...]] = []

    def call_soon_threadsafe(self, fn: object, *args: object) -> None:
        self.calls.append((fn, *args))


@pytest.mark.parametrize(
    ("kind", "seconds"), [("stall_loop", STALL_LOOP_S), ("wedge_loop", WEDGE_LOOP_S)]
)
def test_a_loop_stall_is_scheduled_once(kind: str, seconds: float) -> None:
    hook = FaultHook(kind)
    loop = _Loop()
    hook.after_step(loop)  # type: ignore[arg-type]
    hook.after_step(loop)  # type: ignore[arg-type]
    assert loop.calls == [(time.sleep, seconds)]
    assert hook.kind is None and not hook.hung


def test_a_stall_blocks_the_real_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    """The stall runs on the loop itself (``call_soon_threadsafe``), from any thread."""
    monkeypatch.setattr("servehall.worker.faults.STALL_LOOP_S", 0.2)

    async def main() -> float:
        loop = asyncio.get_running_loop()
        t0 = time.monotonic()
        await asyncio.to_thread(FaultHook("stall_loop").after_step, loop)
        await asyncio.sleep(0)
        return time.monotonic() - t0

    assert asyncio.run(main()) >= 0.2
