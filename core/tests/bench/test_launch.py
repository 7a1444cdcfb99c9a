"""Tests of servehall.bench.launch with real processes: launched_process yields once the
ready URL answers 200 and stops the process afterwards, names a process that exits (with
its last output line) or is not ready in time; CPU seconds of a process and of its
descendants. (``launched_server`` with ``servehall serve``: the bench compare e2e test.)"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from servehall.bench.client import TargetError
from servehall.bench.launch import launched_process, process_cpu_s, process_tree_cpu_s
from servehall.testing.sockets import free_port

psutil = pytest.importorskip("psutil")  # the bench extra


def test_launched_process_is_ready_then_stopped() -> None:
    port = free_port()
    cmd = [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"]
    with launched_process(cmd, f"http://127.0.0.1:{port}/", "http.server", 20, poll_s=0.05) as pid:
        proc = psutil.Process(pid)
        assert proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    with pytest.raises(psutil.NoSuchProcess):
        psutil.Process(pid).status()  # terminated and reaped


def test_a_process_that_exits_is_named_with_its_last_line() -> None:
    cmd = [sys.executable, "-c", "print('starting'); print('port taken'); raise SystemExit(3)"]
    url = f"http://127.0.0.1:{free_port()}/"
    with (
        pytest.raises(TargetError, match=r"^srv exited with status 3: port taken$"),
        launched_process(cmd, url, "srv", 20, poll_s=0.05),
    ):
        pass


def test_a_process_never_ready_times_out() -> None:
    cmd = [sys.executable, "-c", "import time; time.sleep(30)"]
    t0 = time.monotonic()
    url = f"http://127.0.0.1:{free_port()}/"
    with (
        pytest.raises(TargetError, match=r"^slow was not ready within 0\.3 s$"),
        launched_process(cmd, url, "slow", 0.3, poll_s=0.05),
    ):
        pass
    assert time.monotonic() - t0 < 5  # and stopped, not waited for


def test_cpu_seconds_of_a_process_and_its_descendants() -> None:
    busy = "import time\nend = time.process_time() + 0.3\nwhile time.process_time() < end: pass\n"
    child = subprocess.Popen([sys.executable, "-c", busy + "time.sleep(30)"])
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            own, descendants = process_tree_cpu_s(os.getpid())
            if descendants >= 0.3:
                break
            time.sleep(0.05)
        assert own > 0 and descendants >= 0.3
        assert process_cpu_s(os.getpid()) >= own + 0.3
    finally:
        child.kill()
        child.wait()
    child_pid = child.pid
    with pytest.raises(TargetError, match=f"cannot read the CPU time of process {child_pid}"):
        process_tree_cpu_s(child_pid)
