"""The watch on a running worker (:mod:`servehall.worker.watch`): the verdicts on
silence, stalled steps and the kernel's view, and when no verdict is given."""

from __future__ import annotations

import time
from typing import Any

import pytest

from servehall.config.worker import WorkerSettings
from servehall.worker.watch import BEHIND, OK, Verdict, WorkerWatch

SETTINGS = WorkerSettings(
    heartbeat_interval_s=0.05, heartbeat_timeout_s=1.0, busy_timeout_s=5.0, step_timeout_s=2.0
)


class _Proc:
    pid = 4242


class _Gen:
    """What the watch reads of a generation: its process and unread reports."""

    def __init__(self, pending: bool = False) -> None:
        self.proc = _Proc()
        self.pending = pending

    def reports_pending(self) -> bool:
        return self.pending


def _watch(silent: float = 0.0, idle: float = 0.0) -> WorkerWatch:
    w = WorkerWatch("m", SETTINGS)
    now = time.monotonic()
    w.last_heard, w.last_progress = now - silent, now - idle
    return w


@pytest.fixture
def looks(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The kernel's view the watch gets on a look (the list's last entry)."""
    seen: list[str] = []

    def liveness(pid: int, previous: Any) -> tuple[str, None]:
        assert pid == _Proc.pid
        return seen[-1], None

    monkeypatch.setattr("servehall.worker.watch.liveness", liveness)
    return seen


def test_a_worker_heard_from_is_ok() -> None:
    w = _watch()
    assert w.judge(_Gen(), 0) is OK and not OK.lost and not BEHIND.lost
    w.heard(progress=True)
    assert w.judge(_Gen(), 3) is OK


def test_silence_is_a_heartbeat_timeout(looks: list[str]) -> None:
    looks.append("asleep")
    v = _watch(silent=1.5).judge(_Gen(), 0)
    assert v.lost and v.kind == "heartbeat_timeout" and "missed heartbeats for 1.5 s" in v.reason
    assert _watch(silent=1.5).judge(None, 0).kind == "heartbeat_timeout"  # no process to look at


def test_a_stopped_worker_is_lost_as_stopped(looks: list[str]) -> None:
    looks.append("stopped")
    v = _watch(silent=1.5).judge(_Gen(), 0)
    assert v.kind == "stopped" and "SIGSTOP" in v.reason


def test_a_busy_worker_is_forgiven_once_per_silence_then_lost(looks: list[str]) -> None:
    looks.append("busy")
    w = _watch(silent=1.5)
    assert w.judge(_Gen(), 0) is OK and w.busy_silences == 1
    assert w.judge(_Gen(), 0) is OK and w.busy_silences == 1  # the same silence
    w.heard()
    w.last_heard -= 1.5  # heard, then a new silence
    assert w.judge(_Gen(), 0) is OK and w.busy_silences == 2
    v = _watch(silent=6.0).judge(_Gen(), 0)  # past busy_timeout_s
    assert v.kind == "heartbeat_timeout" and "while busy (busy_timeout_s=5)" in v.reason


def test_requests_without_output_are_a_stalled_step() -> None:
    assert _watch(idle=3.0).judge(_Gen(), 0) is OK  # nothing in flight
    v = _watch(idle=3.0).judge(_Gen(), 2)
    assert v == Verdict("step_stalled", v.reason) and "with 2 request(s) in flight" in v.reason
    w = _watch(idle=3.0)
    w.stall_clock()
    assert w.judge(_Gen(), 2) is OK


def test_no_verdict_while_this_process_was_behind(looks: list[str]) -> None:
    looks.append("asleep")
    assert _watch(silent=1.5, idle=3.0).judge(_Gen(pending=True), 1) is BEHIND
    w = _watch(silent=1.5)
    now = time.monotonic()
    w.woke(now - 0.1, now, 0.1)  # slept as long as asked: no grace
    assert w.judge(_Gen(), 0).kind == "heartbeat_timeout"
    w.woke(now - 2.0, now, 0.1)  # this process was not running for 2 s
    assert w.grace_until == pytest.approx(now + 0.1)
    assert w.judge(_Gen(), 0) is BEHIND
