"""``[server] api_processes = N``: N HTTP frontend processes in front of this one.

With N > 1 this process (the *primary*) keeps everything that must be one per node —
the engine workers and their supervisors, admission and the scheduler queues, the
record bus and its audit chain, per-key limits, live config, idle unloading, the canary
guard, ``/metrics`` — and stops accepting connections itself. N frontend processes
(:mod:`servehall.server.frontend`) share its listening sockets (inherited descriptors:
the kernel hands each new connection to one of them) and run HTTP for it; each request
crosses one Unix socket (:mod:`servehall.server.bridge`). vLLM's ``--api-server-count``
is the model (vllm-project/vllm#17546); where the line is drawn here, and why, is in
docs/performance.md ("Several API processes").

:class:`FrontendPool` starts them, restarts one that dies (its requests end as client
disconnects, recorded; the engine worker and the other frontends are not touched) and,
on shutdown, sends each SIGTERM so that it stops accepting and finishes its streams
within ``[server] graceful_timeout_s`` while this process still serves them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import signal
import socket
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

from servehall.config.models import ServerSettings
from servehall.errors import ConfigError

log = logging.getLogger("servehall.server")

START_TIMEOUT_S = 60.0
"""How long the frontends have to connect to the primary at startup."""
RESTART_BACKOFF_S = (0.5, 10.0)
"""First and largest delay before a dead frontend is started again (doubling); the delay
starts over after a frontend has lived :data:`STABLE_AFTER_S`."""
STABLE_AFTER_S = 60.0


def resolve_api_processes(value: int | str, cpus: int | None = None) -> int:
    """The number of API processes ``[server] api_processes`` asks for.

    ``"auto"``: one per four usable CPUs, at least 1 and at most 8 — a frontend at full
    load takes about one core, and the engine workers and the primary need cores too
    (on a 2-core machine ``"auto"`` is 1).
    """
    if value == "auto":
        n = cpus if cpus is not None else len(os.sched_getaffinity(0))
        return max(1, min(8, n // 4))
    return int(value)


def frontend_options(server: ServerSettings, fds: Sequence[int], socket_path: str) -> str:
    """The JSON argument of ``python -m servehall.server.frontend``."""
    fields = server.model_dump(mode="json", exclude={"config_broadcast_url"})
    return json.dumps({"server": fields, "fds": list(fds), "socket": socket_path})


class FrontendPool:
    """Starts, restarts and drains the frontend processes.

    Args:
        count: how many.
        server: ``[server]`` (Hypercorn's limits; log level).
        fds: the listening sockets' descriptors (inherited by every frontend).
        socket_path: the bridge's Unix socket.
        on_restart: called with the frontend's index each time one is started again.
    """

    def __init__(
        self,
        count: int,
        server: ServerSettings,
        fds: Sequence[int],
        socket_path: str,
        on_restart: Callable[[int], None] | None = None,
    ) -> None:
        self.count = count
        self.fds = list(fds)
        self.argument = frontend_options(server, fds, socket_path)
        self.procs: list[asyncio.subprocess.Process | None] = [None] * count
        self.on_restart = on_restart
        self._watchers: list[asyncio.Task[None]] = []
        self._stopping = False

    @property
    def pids(self) -> list[int]:
        """The frontends' process ids (running ones)."""
        return [p.pid for p in self.procs if p is not None and p.returncode is None]

    async def _spawn(self, index: int) -> asyncio.subprocess.Process:
        from servehall.engines.child import die_with_parent

        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "servehall.server.frontend",
            self.argument,
            pass_fds=self.fds,
            preexec_fn=partial(die_with_parent, os.getpid()),
        )
        self.procs[index] = proc
        log.info("API process %d started (pid %d)", index + 1, proc.pid)
        return proc

    async def start(self, connected: Callable[[int], Any]) -> None:
        """Start every frontend and wait until ``connected(count)`` returns (an awaitable
        that resolves once that many are connected to the bridge).

        Raises:
            ConfigError: a frontend exited during startup, or they did not connect
                within :data:`START_TIMEOUT_S`.
        """
        procs = [await self._spawn(i) for i in range(self.count)]
        ready = asyncio.ensure_future(connected(self.count))
        exits = [asyncio.ensure_future(p.wait()) for p in procs]
        try:
            done, _ = await asyncio.wait(
                [ready, *exits], timeout=START_TIMEOUT_S, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            for fut in exits:
                fut.cancel()
        if ready not in done:
            ready.cancel()
            await self.drain(5.0)
            raise ConfigError(
                "an API process exited during startup"
                if done
                else f"the API processes did not start within {START_TIMEOUT_S:.0f} s"
            )
        self._watchers = [asyncio.create_task(self._watch(i)) for i in range(self.count)]

    async def _watch(self, index: int) -> None:
        delay = RESTART_BACKOFF_S[0]
        while not self._stopping:
            proc = self.procs[index]
            assert proc is not None
            started = time.monotonic()
            code = await proc.wait()
            if self._stopping:
                return
            if time.monotonic() - started > STABLE_AFTER_S:
                delay = RESTART_BACKOFF_S[0]
            log.warning(
                "API process %d (pid %d) exited with %s; starting it again in %.1f s",
                index + 1,
                proc.pid,
                code,
                delay,
            )
            await asyncio.sleep(delay)
            delay = min(delay * 2, RESTART_BACKOFF_S[1])
            if self._stopping:
                return
            await self._spawn(index)
            if self.on_restart is not None:
                self.on_restart(index)

    async def drain(self, timeout_s: float) -> None:
        """SIGTERM every frontend (each stops accepting and finishes its streams), wait up
        to ``timeout_s``, then SIGKILL what is left."""
        self._stopping = True
        for task in self._watchers:
            task.cancel()
        live = [p for p in self.procs if p is not None and p.returncode is None]
        for proc in live:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
        if not live:
            return
        waits = [asyncio.ensure_future(p.wait()) for p in live]
        _, pending = await asyncio.wait(waits, timeout=timeout_s)
        for proc in live:
            if proc.returncode is None:
                log.warning("API process pid %d did not stop in time; killing it", proc.pid)
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
        if pending:
            await asyncio.wait(pending, timeout=5)


async def serve_frontends(
    app: Any,
    server: ServerSettings,
    sockets: Sequence[socket.socket],
    count: int,
    stop: asyncio.Event,
    on_restart: Callable[[int], None] | None = None,
) -> None:
    """Serve ``app`` through ``count`` frontend processes on ``sockets`` until ``stop``
    is set, then drain them (the sockets are closed on the way out).

    Raises:
        ConfigError: see :meth:`FrontendPool.start`.
    """
    from servehall.server.bridge import BridgeServer
    from servehall.server.hypercorn.config import server_config

    folder = tempfile.mkdtemp(prefix="servehall-bridge-")
    bridge = BridgeServer(app, os.path.join(folder, "bridge.sock"))
    pool = FrontendPool(count, server, [s.fileno() for s in sockets], bridge.path, on_restart)
    try:
        await bridge.start()
        # listening before the frontends start: a connection that arrives while they do
        # waits in the backlog instead of being refused (each frontend's Hypercorn calls
        # listen() again, which keeps the socket as it is)
        backlog = server_config(server).backlog
        for s in sockets:
            s.listen(backlog)
        await pool.start(bridge.wait_connections)
        await stop.wait()
    finally:
        await pool.drain(server.graceful_timeout_s + 5.0)
        await bridge.close(timeout_s=5.0)
        for s in sockets:
            s.close()
        shutil.rmtree(folder, ignore_errors=True)
