"""The server under test: ``servehall serve`` started by the soak in a work directory of
its own (started, waited for, stopped), and the processes under it (RSS, engine
workers)."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx

from servehall.bench.processes import FRONTEND, process_role
from servehall.bench.soak.options import SoakError, SoakOptions
from servehall.testing.cli import servehall_cmd, stop_process
from servehall.testing.sockets import free_port


@dataclass
class Server:
    """A ``servehall serve`` started by the soak in ``workdir``."""

    process: subprocess.Popen[bytes]
    base_url: str
    workdir: Path
    config: Path
    log_path: Path
    stop_s: float | None = None

    def log_tail(self, n: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def stop(self, timeout: float = 90.0) -> int | None:
        """SIGTERM and wait (SIGKILL after ``timeout``); the exit code."""
        t0 = time.monotonic()
        code = stop_process(self.process, timeout)
        self.stop_s = time.monotonic() - t0
        return code


EMBED_MODEL = "embed"
"""The name a started server serves ``--embed-path`` under (without ``--embed-model``)."""


def embed_model_toml(name: str, path: Path) -> str:
    """The ``[[models]]`` table a started server gets for ``--embed-path``: the model at
    ``path`` served for embedding (``task = "embed"``) on the core's torch CPU backend."""
    return (
        f'\n[[models]]\nname = "{name}"\npath = {json.dumps(str(path.resolve()))}\n'
        'task = "embed"\nbackend = "cpu"\n'
    )


def start_server(opts: SoakOptions, workdir: Path) -> Server:
    """Start ``servehall serve`` (``--demo`` and/or ``--config``) on a free port in
    ``workdir`` and wait for ``/health/ready``; SoakError with the log tail if not.
    Without ``--config`` the server gets a config of its own: a SQLite file in
    ``workdir``, ``[server] api_processes`` (``--api-processes``) and with
    ``--embed-path`` an embedding model (:func:`embed_model_toml`); a given ``--config``
    gets ``--api-processes`` > 1 through ``SERVEHALL_SERVER__API_PROCESSES`` (the
    environment overrides the file)."""
    workdir.mkdir(parents=True, exist_ok=True)
    config = opts.config.resolve() if opts.config is not None else None
    if config is None:
        config = workdir / "soak.toml"
        url = f"sqlite+aiosqlite:///{workdir / 'servehall.db'}"
        text = f'[server]\napi_processes = {opts.api_processes}\n\n[database]\nurl = "{url}"\n'
        if opts.embed_path is not None:
            text += embed_model_toml(opts.embed_model or EMBED_MODEL, opts.embed_path)
        config.write_text(text)
    port = free_port()
    args = [*servehall_cmd(), "serve", "--config", str(config), "--bind", f"127.0.0.1:{port}"]
    if opts.demo:
        args.append("--demo")
    log_path = workdir / "server.log"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if opts.config is not None and opts.api_processes > 1:
        env["SERVEHALL_SERVER__API_PROCESSES"] = str(opts.api_processes)
    with log_path.open("wb") as log:
        proc = subprocess.Popen(args, cwd=workdir, env=env, stdout=log, stderr=subprocess.STDOUT)
    server = Server(proc, f"http://127.0.0.1:{port}", workdir, config, log_path)
    deadline = time.monotonic() + opts.ready_timeout_s
    with httpx.Client(timeout=5.0) as c:
        while True:
            if proc.poll() is not None:
                raise SoakError(
                    f"servehall serve exited with {proc.returncode}:\n{server.log_tail()}"
                )
            with contextlib.suppress(httpx.HTTPError):
                if c.get(server.base_url + "/health/ready").status_code == 200:
                    return server
            if time.monotonic() > deadline:
                server.stop(10)
                raise SoakError(f"servehall serve not ready in time:\n{server.log_tail()}")
            time.sleep(0.3)


def process_tree(pid: int) -> list[int]:
    """``pid`` and its descendants (Linux ``/proc``)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        for task in Path(f"/proc/{p}/task").glob("*"):
            with contextlib.suppress(OSError):
                todo += [int(c) for c in (task / "children").read_text().split()]
    return out


def rss_bytes(pids: Sequence[int]) -> int:
    """Summed ``VmRSS`` of ``pids`` (and their descendants) in bytes."""
    total = 0
    for root in pids:
        for p in process_tree(root):
            with contextlib.suppress(OSError):
                for line in Path(f"/proc/{p}/status").read_text().splitlines():
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1]) * 1024
    return total


def frontend_pids(server_pid: int) -> list[int]:
    """The HTTP frontend processes under ``server_pid`` (``-m servehall.server.frontend``,
    ``[server] api_processes`` > 1), sorted; empty with one API process."""
    out = []
    for p in process_tree(server_pid)[1:]:
        with contextlib.suppress(OSError):
            argv = Path(f"/proc/{p}/cmdline").read_bytes().decode(errors="replace").split("\0")
            if process_role(argv) == FRONTEND:
                out.append(p)
    return sorted(out)


def worker_pids(server_pid: int) -> list[int]:
    """The engine worker processes under ``server_pid`` (multiprocessing spawn children,
    not the resource tracker)."""
    out = []
    for p in process_tree(server_pid)[1:]:
        with contextlib.suppress(OSError):
            cmd = Path(f"/proc/{p}/cmdline").read_bytes().replace(b"\0", b" ")
            if b"spawn_main" in cmd:
                out.append(p)
    return out
