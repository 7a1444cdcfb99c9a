"""Fixtures of the Hypercorn connection tests: ``start`` runs ``conn_server.py`` (a tiny
ASGI app on a real Hypercorn, with or without servehall's fixes) as a subprocess."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from servehall.testing.sockets import free_port

SERVER = Path(__file__).with_name("conn_server.py")


class Server:
    def __init__(self, proc: subprocess.Popen[bytes], port: int) -> None:
        self.proc = proc
        self.port = port

    def stop(self, timeout: float = 40.0) -> float:
        """SIGTERM; returns the seconds the process took to exit."""
        t0 = time.monotonic()
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        return time.monotonic() - t0


@pytest.fixture
def start() -> Iterator[Callable[..., Server]]:
    servers: list[Server] = []

    def factory(*args: str, fixes: bool = True) -> Server:
        port = free_port()
        cmd = [sys.executable, str(SERVER), str(port), *(["--fixes"] if fixes else []), *args]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        srv = Server(proc, port)
        servers.append(srv)
        assert proc.stdout is not None
        if proc.stdout.readline().strip() != b"ready":
            raise RuntimeError("conn_server.py did not start")
        return srv

    yield factory
    for srv in servers:
        srv.stop(5)


@pytest.fixture
def port() -> Iterator[int]:
    """The port of a ``conn_server.py`` with servehall's fixes and 64 streams per
    connection (the HTTP/2 scheduler and direct-data tests)."""
    free = free_port()
    proc = subprocess.Popen(
        [sys.executable, str(SERVER), str(free), "--fixes", "--max-streams", "64"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == b"ready"
        yield free
    finally:
        proc.terminate()
        proc.wait(10)
