"""The liveness verdict on a silent worker (servehall.worker.liveness), with real child
processes: one stopped by SIGSTOP, one spinning on the CPU, one asleep, one gone; and
the supervisor's use of it (a stopped worker is restarted with reason ``stopped``)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from servehall.config.models import ModelConfig
from servehall.config.worker import WorkerSettings
from servehall.worker import ProcessEngine
from servehall.worker.liveness import ProcSample, liveness, sample

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc")

SPIN = "while True: pass"
SLEEP = "import time; time.sleep(600)"


@contextlib.contextmanager
def child(code: str) -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen([sys.executable, "-c", code])
    try:
        yield proc
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGCONT)
        proc.kill()
        proc.wait(10)


def settle(pid: int, want: str, timeout: float = 10.0) -> ProcSample:
    """Wait until the process's main state is one of ``want``."""
    deadline = time.monotonic() + timeout
    while True:
        s = sample(pid)
        assert s is not None
        if s.state in want or time.monotonic() > deadline:
            return s
        time.sleep(0.02)


def test_a_stopped_process_is_stopped() -> None:
    with child(SPIN) as proc:
        os.kill(proc.pid, signal.SIGSTOP)
        settle(proc.pid, "Tt")
        verdict, s = liveness(proc.pid)
        assert verdict == "stopped" and s is not None and s.state in "Tt"
        # a stopped process stays stopped, whatever CPU time it spent before
        assert liveness(proc.pid, s)[0] == "stopped"


def test_a_spinning_process_is_busy_and_spends_cpu() -> None:
    with child(SPIN) as proc:
        first = settle(proc.pid, "R")
        time.sleep(0.3)
        verdict, s = liveness(proc.pid, first)
        assert verdict == "busy"
        assert s is not None and s.cpu_ticks > first.cpu_ticks


def test_a_process_that_spent_cpu_since_the_last_look_is_busy_even_when_asleep() -> None:
    with child(SLEEP) as proc:
        s = settle(proc.pid, "S")
        assert liveness(proc.pid)[0] == "asleep"
        before = ProcSample(s.state, False, s.cpu_ticks - 1)  # as if it ran since then
        assert liveness(proc.pid, before)[0] == "busy"


def test_a_sleeping_process_is_asleep() -> None:
    with child(SLEEP) as proc:
        s = settle(proc.pid, "S")
        time.sleep(0.2)
        verdict, again = liveness(proc.pid, s)
        assert verdict == "asleep" and again is not None and not again.working


def test_a_gone_or_zombie_process_or_no_proc_is_unknown(tmp_path: Path) -> None:
    with child("pass") as proc:
        deadline = time.monotonic() + 10
        while (s := sample(proc.pid)) is not None and s.state != "Z":
            assert time.monotonic() < deadline
            time.sleep(0.02)
        assert liveness(proc.pid)[0] == "unknown"  # a zombie: its exit is the sentinel's
    assert liveness(proc.pid)[0] == "unknown"  # reaped
    assert liveness(os.getpid(), proc=str(tmp_path))[0] == "unknown"  # not Linux


def test_a_command_name_with_spaces_and_parentheses_is_parsed(tmp_path: Path) -> None:
    (tmp_path / "7" / "task" / "7").mkdir(parents=True)
    line = "7 (a) b (c) S 1 7 7 0 -1 4194560 100 0 0 0 12 3 0 0 20 0 1 0 5 0 0\n"
    (tmp_path / "7" / "stat").write_text(line)
    (tmp_path / "7" / "task" / "7" / "stat").write_text(line)
    assert sample(7, str(tmp_path)) == ProcSample("S", False, 15)
    (tmp_path / "7" / "task" / "8").mkdir()
    (tmp_path / "7" / "task" / "8" / "stat").write_text(line.replace(" S ", " R "))
    assert liveness(7, proc=str(tmp_path))[0] == "busy"  # another thread is runnable


async def test_a_stopped_worker_is_restarted_with_reason_stopped(
    servehall_tiny_llama: Path,
) -> None:
    """SIGSTOP of the worker: lost within heartbeat_timeout_s + the watch interval (plus
    slack for a loaded machine), counted as ``stopped``, and a new worker serves."""
    model = ModelConfig(
        name="tiny",
        path=servehall_tiny_llama,
        backend="cpu",
        max_model_len=256,
        options={"kv_cache_blocks": 64, "block_size": 16},
    )
    settings = WorkerSettings(
        heartbeat_interval_s=0.05, heartbeat_timeout_s=0.5, restart_backoff_s=0.1
    )
    engine = ProcessEngine(model, "cpu", (), settings=settings)
    await engine.start()
    try:
        proc = engine.supervisor._gen.proc  # type: ignore[union-attr]
        os.kill(proc.pid, signal.SIGSTOP)
        stopped = time.monotonic()
        while not engine.restart_counts["stopped"]:
            assert time.monotonic() - stopped < 10, engine.restart_counts
            await asyncio.sleep(0.02)
        took = time.monotonic() - stopped
        assert took >= settings.heartbeat_timeout_s
        assert engine.restart_counts["heartbeat_timeout"] == 0
        assert "stopped" in engine.state_reason
        assert engine.last_exit_reason == "stopped"
        print(f"a stopped worker was declared lost after {took:.2f} s")
        assert await engine.wait_up(120)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGCONT)
        await engine.shutdown()
