"""Processes a benchmark starts and measures: a server launched for one run
(``launched_server``, ``launched_process``: ready when a URL answers 200, stopped at the
end) and the CPU seconds of a process and its descendants (``process_cpu_s``,
``process_tree_cpu_s``, from ``/proc`` through psutil). Used by ``bench compare``
(:mod:`servehall.bench.compare`) and vLLM's own server target
(:mod:`servehall.bench.vllm_server`)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

from servehall.bench.client import TargetError
from servehall.testing.cli import servehall_cmd
from servehall.testing.sockets import free_port


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` and its live descendants (engine worker
    processes included). Raises TargetError when the process does not exist."""
    own, descendants = process_tree_cpu_s(pid)
    return own + descendants


def process_tree_cpu_s(pid: int) -> tuple[float, float]:
    """``(own, descendants)``: user + system CPU seconds of process ``pid`` itself and of
    its live descendants (a server's engine worker processes), from ``/proc`` through
    psutil. Raises TargetError when the process does not exist."""
    try:
        import psutil
    except ImportError:
        raise TargetError("CPU accounting needs psutil (pip install 'servehall[bench]')") from None
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error as exc:
        raise TargetError(f"cannot read the CPU time of process {pid}: {exc}") from None
    own = descendants = 0.0
    for p in procs:
        with contextlib.suppress(psutil.Error):
            t = p.cpu_times()
            if p is root:
                own = t.user + t.system
            else:
                descendants += t.user + t.system
    return own, descendants


@contextlib.contextmanager
def launched_server(
    config: Path, *, timeout_s: float = 1200.0, api_processes: int | None = None
) -> Iterator[tuple[str, int]]:
    """Start ``servehall serve --config CONFIG`` on a free port; yield ``(url, pid)`` once
    ``/health/ready`` answers 200; SIGTERM it on exit. ``api_processes``: ``[server]
    api_processes`` set through ``SERVEHALL_SERVER__API_PROCESSES`` (over the config).
    Raises TargetError when it exits or is not ready within ``timeout_s`` (with the last
    line of its stderr)."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [
        *servehall_cmd(),
        "serve",
        "--config",
        str(config),
        "--bind",
        f"127.0.0.1:{port}",
    ]
    env = None
    if api_processes is not None:
        env = {**os.environ, "SERVEHALL_SERVER__API_PROCESSES": str(api_processes)}
    ready = f"{url}/health/ready"
    with launched_process(cmd, ready, "servehall serve", timeout_s, env=env) as pid:
        yield url, pid


@contextlib.contextmanager
def launched_process(
    cmd: list[str],
    ready_url: str,
    what: str,
    timeout_s: float,
    *,
    env: dict[str, str] | None = None,
    poll_s: float = 0.2,
) -> Iterator[int]:
    """Run ``cmd`` (a server); yield its pid once ``ready_url`` answers 200; SIGTERM it
    (SIGKILL after 30 s) on exit. Its output goes to a temporary log file.

    Raises:
        TargetError: it exited, or was not ready within ``timeout_s`` (names ``what`` and
            the last line of its output).
    """
    import httpx

    log = Path(os.environ.get("TMPDIR", "/tmp")) / f"servehall-bench-{os.getpid()}-{id(cmd)}.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            if proc.poll() is not None:
                tail = log.read_text(errors="replace").strip().splitlines()
                raise TargetError(
                    f"{what} exited with status {proc.returncode}: "
                    f"{tail[-1] if tail else 'no output'}"
                )
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(ready_url, timeout=2).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise TargetError(f"{what} was not ready within {timeout_s:g} s")
            time.sleep(poll_s)
        yield proc.pid
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.unlink(missing_ok=True)
