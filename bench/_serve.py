"""A real ``servehall serve`` subprocess for the benchmarks (not a test fixture).

:func:`serving` writes a config (the demo model on ``backend = "auto"`` plus the given
sections) to a temporary directory, starts ``servehall serve`` on a free 127.0.0.1
port, waits for ``GET /health/ready`` = 200 and yields a :class:`Server`; on exit it
sends SIGTERM (SIGKILL after 15 s). The demo model is built once into
``$SERVEHALL_BENCH_DEMO_DIR`` (default ``~/.cache/servehall/bench-demo``).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from servehall.testing.cli import servehall_cmd
from servehall.testing.sockets import free_port

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.conftest import dump_toml


def demo_dir() -> Path:
    """The demo model directory (built on first use)."""
    from servehall.demo import build_demo_model

    where = os.environ.get("SERVEHALL_BENCH_DEMO_DIR") or "~/.cache/servehall/bench-demo"
    return Path(build_demo_model(Path(where).expanduser()))


def config(**sections: Any) -> dict[str, Any]:
    """A config serving the demo model as ``demo`` (openvino_cpu, f32), no sinks."""
    cfg: dict[str, Any] = {
        "plugins": {"enabled": ["openvino_cpu"]},
        "models": [
            {
                "name": "demo",
                "path": str(demo_dir()),
                "backend": "auto",
                "options": {"inference_precision": "f32"},
            }
        ],
        "sinks": [],
    }
    cfg.update(sections)
    return cfg


@dataclass
class Server:
    """A running server: ``base_url``, ``port``, ``process``, ``log_path``."""

    base_url: str
    port: int
    process: subprocess.Popen[bytes]
    log_path: Path

    def rss_bytes(self) -> int:
        """Resident memory of the server process (bytes, from /proc)."""
        with open(f"/proc/{self.process.pid}/status") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        return 0

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")


@contextlib.contextmanager
def serving(cfg: Mapping[str, Any], *, env: Mapping[str, str] | None = None) -> Iterator[Server]:
    """Start ``servehall serve`` with ``cfg`` and yield the :class:`Server`."""
    tmp = Path(tempfile.mkdtemp(prefix="servehall-bench-"))
    cfg_path = tmp / "config.toml"
    cfg_path.write_text(dump_toml(cfg))
    port = free_port()
    log_path = tmp / "server.log"
    cmd = [
        *servehall_cmd(),
        "serve",
        "--config",
        str(cfg_path),
        "--bind",
        f"127.0.0.1:{port}",
    ]
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            cmd, cwd=tmp, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}
        )
    srv = Server(f"http://127.0.0.1:{port}", port, proc, log_path)
    try:
        end = time.monotonic() + 600
        while True:
            if proc.poll() is not None:
                raise RuntimeError("server exited:\n" + srv.log_text()[-3000:])
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(srv.base_url + "/health/ready", timeout=2).status_code == 200:
                    break
            if time.monotonic() > end:
                raise RuntimeError("server not ready:\n" + srv.log_text()[-3000:])
            time.sleep(0.2)
        yield srv
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
