"""The server under test (servehall.bench.soak.server): the process tree and RSS read
from ``/proc``, and a stop that ends the process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from servehall.bench.soak.server import (
    Server,
    frontend_pids,
    process_tree,
    rss_bytes,
    worker_pids,
)

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


def test_frontend_processes_are_found_by_their_module() -> None:
    """``api-kill``'s targets: the children whose argv holds ``servehall.server.frontend``
    (``python -m servehall.server.frontend '<json>'``), not other children."""
    sleep = "import time; time.sleep(30)"
    children = [
        subprocess.Popen([sys.executable, "-c", sleep, "servehall.server.frontend"]),
        subprocess.Popen([sys.executable, "-c", sleep, "servehall.server.frontend"]),
        subprocess.Popen([sys.executable, "-c", sleep, "servehall.server.frontends"]),
    ]
    try:
        assert frontend_pids(os.getpid()) == sorted(c.pid for c in children[:2])
        assert frontend_pids(children[2].pid) == []
    finally:
        for c in children:
            c.kill()
            c.wait()


def test_stop_ends_the_server_and_gives_its_exit_code(tmp_path: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    server = Server(proc, "http://127.0.0.1:1", tmp_path, tmp_path / "c.toml", tmp_path / "l")
    assert server.log_tail() == ""
    assert server.stop(10) == -15  # SIGTERM
    assert server.stop_s is not None and server.stop_s < 10


def test_embed_model_table_is_a_valid_embedding_model(tmp_path: Path) -> None:
    from servehall.bench.soak.server import embed_model_toml
    from servehall.config.settings import load_settings

    model_dir = tmp_path / 'we"ird dir'
    model_dir.mkdir()
    cfg = tmp_path / "c.toml"
    cfg.write_text(
        '[database]\nurl = "sqlite+aiosqlite:///x.db"\n' + embed_model_toml("e", model_dir)
    )
    (model,) = load_settings(cfg).models
    assert (model.name, model.task, model.backend) == ("e", "embed", "cpu")
    assert Path(model.path) == model_dir.resolve()
