"""The server under test (servehall.bench.soak.server): the process tree and RSS read
from ``/proc``, and a stop that ends the process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from servehall.bench.soak.server import Server, process_tree, rss_bytes, worker_pids

pytestmark = pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs /proc")


def test_the_process_tree_and_its_rss() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        tree = process_tree(os.getpid())
        assert tree[0] == os.getpid() and child.pid in tree
        assert rss_bytes([child.pid]) > 0
        assert rss_bytes([os.getpid()]) > rss_bytes([child.pid])
        assert worker_pids(child.pid) == []  # not a multiprocessing spawn child
    finally:
        child.kill()
        child.wait()


def test_stop_ends_the_server_and_gives_its_exit_code(tmp_path: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    server = Server(proc, "http://127.0.0.1:1", tmp_path, tmp_path / "c.toml", tmp_path / "l")
    assert server.log_tail() == ""
    assert server.stop(10) == -15  # SIGTERM
    assert server.stop_s is not None and server.stop_s < 10
