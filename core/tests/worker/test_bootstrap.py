"""The start of a worker process (:mod:`servehall.worker.bootstrap`): its spec, the
switch interval, the process-group guard."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from servehall.config.models import ModelConfig
from servehall.config.worker import WorkerSettings
from servehall.worker.bootstrap import GUARD_INTERVAL_S, WorkerSpec, apply_switch_interval


def test_the_worker_switch_interval_comes_from_the_model_settings(tmp_path: Path) -> None:
    """``[[models]] worker.switch_interval_s`` becomes the worker process's switch interval
    (an engine whose step() holds the GIL makes the loop wait that long per socket call);
    unset, Python's default stays."""

    def spec(value: float | None) -> WorkerSpec:
        return WorkerSpec(
            model=ModelConfig(name="m", path=tmp_path),
            backend="null",
            plugins=(),
            socket_path="unused",
            parent_pid=os.getpid(),
            generation=1,
            heartbeat_interval_s=0.1,
            switch_interval_s=WorkerSettings(switch_interval_s=value).switch_interval_s,
        )

    before = sys.getswitchinterval()
    try:
        apply_switch_interval(spec(None))
        assert sys.getswitchinterval() == before
        apply_switch_interval(spec(0.002))
        assert sys.getswitchinterval() == pytest.approx(0.002)
    finally:
        sys.setswitchinterval(before)


@pytest.mark.skipif(sys.platform != "linux", reason="process groups and /bin/sh")
def test_the_guard_kills_the_group_once_its_worker_is_gone(tmp_path: Path) -> None:
    """A grandchild left in the worker's process group (as vLLM's engine core is) dies
    within a guard interval of the worker."""
    pidfile = tmp_path / "sleeper"
    script = (
        "import os, subprocess, sys\n"
        "os.setpgid(0, 0)\n"
        "from servehall.worker.bootstrap import guard_group\n"
        "guard_group()\n"
        f"p = subprocess.Popen(['sleep', '60'])\n"
        f"open({str(pidfile)!r}, 'w').write(str(p.pid))\n"
        "os._exit(0)\n"
    )
    subprocess.run([sys.executable, "-c", script], check=True, timeout=60)
    sleeper = int(pidfile.read_text())
    deadline = time.monotonic() + 20 * GUARD_INTERVAL_S + 5
    while time.monotonic() < deadline:
        try:
            os.kill(sleeper, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    os.kill(sleeper, 9)
    pytest.fail("the grandchild outlived the worker's guard")
