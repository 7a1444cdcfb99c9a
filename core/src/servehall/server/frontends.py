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
        fds: the listening sockets' descriptors each frontend inherits, one list per
            frontend (the same list for all where they share the sockets).
        socket_path: the bridge's Unix socket.
        on_restart: called with the frontend's index each time one is started again.
    """

    def __init__(
        self,
        count: int,
        server: ServerSettings,
        fds: Sequence[Sequence[int]],
        socket_path: str,
        on_restart: Callable[[int], None] | None = None,
    ) -> None:
        if len(fds) != count:
            raise ValueError(f"{count} frontends need {count} lists of descriptors")
        self.count = count
        self.fds = [list(f) for f in fds]
        self.arguments = [frontend_options(server, f, socket_path) for f in fds]
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
            self.arguments[index],
            pass_fds=self.fds[index],
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


def listening_groups(
    sockets: Sequence[socket.socket], count: int, backlog: int
) -> list[list[socket.socket]]:
    """The listening sockets of each of ``count`` frontends, all listening already (a
    connection that arrives while the frontends start waits in a backlog).

    Sockets bound with ``SO_REUSEPORT`` (:func:`serve_frontends` binds them so on
    Linux) get a copy per further frontend
    (:func:`~servehall.server.listeners.reuse_port_copies`): the kernel spreads new
    connections over the frontends by a hash of each connection, so a burst of them (a
    load balancer's or client pool's connections, opened at once) is shared out too. A
    frontend that is being restarted keeps its queue: connections hashed to it wait
    until it is back. Otherwise every frontend gets ``sockets`` themselves and the
    kernel wakes all of them for each connection (:func:`servehall.server.frontend.
    accept_one_per_turn` makes them take turns).

    Raises:
        ConfigError: a copy could not be bound.
    """
    from servehall.server.listeners import can_reuse_port, reuse_port_copies

    groups = [list(sockets)]
    shared = not can_reuse_port() or not all(
        s.getsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT) for s in sockets
    )
    try:
        for _ in range(count - 1):
            groups.append(groups[0] if shared else reuse_port_copies(sockets))
    except BaseException:
        for g in groups[1:]:
            for s in g:
                s.close()
        raise
    for g in groups[: 1 if shared else count]:
        for s in g:
            s.listen(backlog)
    return groups


async def serve_frontends(
    app: Any,
    server: ServerSettings,
    binds: Sequence[str],
    count: int,
    stop: asyncio.Event,
    on_restart: Callable[[int], None] | None = None,
    on_accept_error: Callable[[int], Any] | None = None,
) -> None:
    """Serve ``app`` through ``count`` frontend processes on ``binds`` (``host:port``
    entries) until ``stop`` is set, then drain them. ``on_restart``:
    called with a frontend's index when it is started again; ``on_accept_error``: with
    the errno of a frontend's failed ``accept()``.

    Raises:
        ConfigError: a bind entry cannot be bound (``cannot bind HOST:PORT: REASON``);
            see also :meth:`FrontendPool.start`.
    """
    from servehall.server.bridge import BridgeServer
    from servehall.server.hypercorn.config import server_config
    from servehall.server.listeners import bind_sockets, can_reuse_port

    sockets = bind_sockets(binds, reuse_port=can_reuse_port())
    try:
        groups = listening_groups(sockets, count, server_config(server).backlog)
    except BaseException:
        for s in sockets:
            s.close()
        raise
    folder = tempfile.mkdtemp(prefix="servehall-bridge-")
    bridge = BridgeServer(app, os.path.join(folder, "bridge.sock"), on_accept_error)
    fds = [[s.fileno() for s in g] for g in groups]
    pool = FrontendPool(count, server, fds, bridge.path, on_restart)
    try:
        await bridge.start()
        await pool.start(bridge.wait_connections)
        await stop.wait()
    finally:
        for s in {id(s): s for g in groups for s in g}.values():
            s.close()  # the frontends' copies close as they stop accepting
        await pool.drain(server.graceful_timeout_s + 5.0)
        await bridge.close(timeout_s=5.0)
        shutil.rmtree(folder, ignore_errors=True)
