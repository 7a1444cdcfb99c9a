"""Starting a model that needs converting, end to end: the real server converts the demo
model (a Hugging Face directory) to OpenVINO IR *before* its worker starts — the
converter is the API process's own child, and the log says so — and when the server is
SIGKILLed in the middle of that build, the converter dies with it (no orphan keeps
converting) and no finished-looking cache entry is left."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.conftest import _serve_cmd, dump_toml, free_port

CONVERTER = "servehall_openvino_cpu.convert"


def _procs() -> dict[int, tuple[int, str]]:
    """pid → (parent pid, command line) of every live (non-zombie) process."""
    out: dict[int, tuple[int, str]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{entry}/cmdline", "rb") as fh:
                cmd = fh.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if fields[0] != "Z":
            out[int(entry)] = (int(fields[1]), cmd)
    return out


def test_server_killed_during_a_build_leaves_no_builder(
    tmp_path: Path,
    demo_model_dir: Path,
    demo_config_factory: Callable[..., dict[str, Any]],
) -> None:
    cache = tmp_path / "ov-cache"
    cfg = demo_config_factory(demo_model_dir)
    cfg["models"][0] |= {"backend": "openvino_cpu"}
    cfg["models"][0]["options"] = {**cfg["models"][0]["options"], "cache_dir": str(cache)}
    (tmp_path / "s.toml").write_text(dump_toml(cfg))
    log_path = tmp_path / "s.log"
    cmd = [*_serve_cmd(), "serve", "--config", str(tmp_path / "s.toml")]
    cmd += ["--bind", f"127.0.0.1:{free_port()}"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("SERVEHALL_CONFIG", None)
    with log_path.open("wb") as log:
        server = subprocess.Popen(
            cmd,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
        )
    try:
        deadline = time.monotonic() + 180
        builder = None
        while builder is None:
            assert server.poll() is None, log_path.read_text()[-3000:]
            assert time.monotonic() < deadline, "no converter started:\n" + log_path.read_text()
            builder = next(
                (
                    (pid, ppid)
                    for pid, (ppid, cmd) in _procs().items()
                    if CONVERTER in cmd and str(cache) in cmd
                ),
                None,
            )
            time.sleep(0.1)
        pid, ppid = builder
        # built by the API process itself, before any worker exists
        assert ppid == server.pid, (ppid, server.pid)
        assert "preparing the model before its worker starts" in log_path.read_text()
        workers = [c for p, (pp, c) in _procs().items() if pp == server.pid and "spawn_main" in c]
        assert workers == [], workers
        server.send_signal(signal.SIGKILL)
        server.wait(10)
        deadline = time.monotonic() + 10
        while pid in _procs():
            assert time.monotonic() < deadline, f"converter {pid} outlived the killed server"
            time.sleep(0.05)
    finally:
        if server.poll() is None:
            server.kill()
            server.wait(10)
    # only the lock and the killed build's hidden temporary directory (which the next
    # build removes): no entry a later start could take for a finished conversion
    left = sorted(p.name for p in cache.iterdir())
    assert all(name.startswith(".") for name in left), left
