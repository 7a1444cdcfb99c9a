"""``servehall.engines.child.die_with_parent``: a child whose parent is already gone exits
at once; one whose parent is SIGKILLed later gets SIGKILL from the kernel (Linux)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from servehall.engines.child import die_with_parent

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl is Linux's")


def test_a_child_of_another_parent_exits_at_once() -> None:
    pid = os.fork()
    if pid == 0:  # the child: its parent is not pid 1
        die_with_parent(1)
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 1


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return True
    return state in ("Z", "X")  # dead; a zombie until something reaps it


def test_a_child_dies_with_its_sigkilled_parent() -> None:
    middle = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import os, subprocess, sys, time\n"
            "from servehall.engines.child import die_with_parent\n"
            "me = os.getpid()\n"
            "p = subprocess.Popen(['sleep', '60'], preexec_fn=lambda: die_with_parent(me))\n"
            "print(p.pid, flush=True)\n"
            "time.sleep(60)\n",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert middle.stdout is not None
        grandchild = int(middle.stdout.readline())
        assert not _gone(grandchild)
        middle.send_signal(signal.SIGKILL)
        middle.wait(10)
        deadline = time.monotonic() + 10
        while not _gone(grandchild) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert _gone(grandchild)
    finally:
        middle.kill()
        middle.wait(10)
