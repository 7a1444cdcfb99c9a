"""Tests of servehall.testing.cli: the real ``servehall`` command as a subprocess —
its argv, the config and environment it runs with, and stopping a started server."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from servehall.testing.cli import run_cli, servehall_cmd, stop_process


def test_servehall_cmd_uses_this_interpreter() -> None:
    cmd = servehall_cmd()
    assert cmd[0] == sys.executable and cmd[1] == "-c" and "servehall.cli" in cmd[2]


def test_run_cli_passes_the_config(tmp_path: Path) -> None:
    good = tmp_path / "good.toml"
    good.write_text('[scheduler]\npolicy = "fair"\n')
    done = run_cli(good, "config", "show")
    assert done.returncode == 0, done.stderr
    assert '"policy": "fair"' in done.stdout


def test_run_cli_env_and_unset(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text("")
    monkeypatch.setenv("SERVEHALL_SCHEDULER__POLICY", "priority")
    assert '"policy": "priority"' in run_cli(cfg, "config", "show").stdout  # inherited
    unset = run_cli(cfg, "config", "show", unset=["SERVEHALL_SCHEDULER"])
    assert '"policy": "fcfs"' in unset.stdout  # left out: the default
    given = run_cli(cfg, "config", "show", env={"SERVEHALL_SCHEDULER__POLICY": "fair"})
    assert '"policy": "fair"' in given.stdout  # added over this process's environment


def test_run_cli_never_raises_on_failure(tmp_path: Path) -> None:
    done = run_cli(tmp_path / "missing.toml", "config", "show")
    assert done.returncode != 0 and done.stderr


def test_stop_process_terminates_then_kills() -> None:
    polite = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    assert stop_process(polite, timeout=10) == -15  # SIGTERM
    stubborn = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            "print('ready', flush=True); time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
    )
    assert stubborn.stdout is not None and stubborn.stdout.readline() == b"ready\n"
    assert stop_process(stubborn, timeout=0.3) == -9  # SIGKILL after the timeout
    assert stop_process(stubborn, timeout=0.3) == -9  # already gone: its code again
