"""A real ``redis-server`` for tests (``[auth] limits_url``): :class:`RedisServer`.

Starts Debian's ``redis-server`` (installed by ``.ci/services.d/redis.sh``) on a free
loopback port, without persistence, in a temporary directory; :meth:`RedisServer.stop`
and :meth:`RedisServer.start` again on the same port simulate an outage. Tests skip
when the binary is missing (:func:`redis_server_binary` returns None).
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from servehall.testing.sockets import free_port


def redis_server_binary() -> str | None:
    """Path of ``redis-server`` (PATH, /usr/bin, /usr/sbin), or None."""
    found = shutil.which("redis-server")
    if found:
        return found
    for p in ("/usr/bin/redis-server", "/usr/sbin/redis-server"):
        if Path(p).is_file():
            return p
    return None


class RedisServer:
    """One ``redis-server`` process on 127.0.0.1 (see module docstring).

    Attributes:
        port: the TCP port (kept across :meth:`stop`/:meth:`start`).
        url: ``redis://127.0.0.1:<port>/0``.
    """

    def __init__(self, port: int | None = None) -> None:
        binary = redis_server_binary()
        if binary is None:
            raise RuntimeError("redis-server is not installed (.ci/services.d/redis.sh)")
        self.binary = binary
        self.port = port or free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.dir = Path(tempfile.mkdtemp(prefix="servehall-redis-"))
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 15.0) -> RedisServer:
        """Start the server and wait until it accepts connections.

        Raises:
            RuntimeError: it exited or did not listen within ``timeout`` seconds.
        """
        log = (self.dir / "redis.log").open("ab")
        self.process = subprocess.Popen(
            [
                self.binary,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.dir),
                "--protected-mode",
                "no",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"redis-server exited: {self.log_text()[-2000:]}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(16).startswith(b"+PONG"):
                        return self
            except OSError:
                pass
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"redis-server not listening after {timeout:g} s")

    def stop(self) -> None:
        """Stop the server (SIGTERM, then SIGKILL); its data is gone."""
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
        self.process = None

    def log_text(self) -> str:
        """The server's log so far."""
        try:
            return (self.dir / "redis.log").read_text(errors="replace")
        except OSError:
            return ""

    def close(self) -> None:
        """Stop and remove the temporary directory."""
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
