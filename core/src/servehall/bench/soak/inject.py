"""Fault injection during a soak run: the processes and commands the declared faults act
on, and the task that injects them in turn while the clients run (the fault kinds
themselves are in :mod:`servehall.bench.soak.faults`)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from pathlib import Path
from typing import TextIO

import httpx

from servehall.bench.soak.clients import Traffic
from servehall.bench.soak.faults import (
    DB_FAULTS,
    FaultError,
    FaultTargets,
    pg_ctl_restart,
    postmaster_pid,
    run_shell,
    stop_processes,
)
from servehall.bench.soak.invariants import FaultWindow
from servehall.bench.soak.options import SoakError, SoakOptions, planned_database_url
from servehall.bench.soak.server import Server, frontend_pids, process_tree, worker_pids

API_BACK_TIMEOUT_S = 30.0
"""How long ``api-kill`` waits for the killed frontend's successor to appear (the
serve process starts it again after 0.5 s, :mod:`servehall.server.frontends`)."""


async def _ready(base_url: str, timeout: float) -> None:
    """Wait (at most ``timeout`` s) until ``/health/ready`` answers 200."""
    deadline = time.monotonic() + timeout
    async with httpx.AsyncClient(timeout=3.0) as c:
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError):
                if (await c.get(base_url + "/health/ready")).status_code == 200:
                    return
            await asyncio.sleep(0.2)


async def inject_faults(
    opts: SoakOptions,
    server: Server | None,
    targets: FaultTargets,
    traffic: Traffic,
    out: TextIO,
) -> None:
    """Inject ``opts.faults`` in turn, one every ``fault_interval_s`` (default: spread
    over the run), into the started ``server``; each fault's window (from injection to
    a few seconds after readiness) goes to ``traffic.faults``."""
    if not opts.faults or server is None:
        return
    interval = opts.fault_interval_s or opts.duration_s / (len(opts.faults) + 1)
    t_end = time.monotonic() + opts.duration_s
    i = 0
    while True:
        await asyncio.sleep(interval)
        if time.monotonic() + 5 > t_end:
            return
        fault = opts.faults[i % len(opts.faults)]
        i += 1
        start = time.monotonic()
        try:
            what = await _inject(fault, server, targets, opts.fault_stop_s, i - 1)
        except FaultError as exc:
            traffic.fault_errors.append(f"{fault}: {exc}")
            print(f"fault {fault} not injected: {exc}", file=out)
            what = "failed"
        await asyncio.sleep(1.0)
        await _ready(server.base_url, 120.0)
        end = time.monotonic() + 3.0  # requests answered just after readiness
        traffic.faults.append(FaultWindow(fault, start, end))
        print(f"fault {fault} ({what}): window {end - start:.1f} s", file=out)


async def kill_api_process(server: Server, turn: int) -> str:
    """``api-kill``: SIGKILL one of the server's frontend processes (the ``turn``-th of
    them, in pid order, modulo their number), then wait up to :data:`API_BACK_TIMEOUT_S`
    for as many frontends as before, the killed one replaced.

    Returns:
        What happened, one line (the pids, and how long the successor took).

    Raises:
        FaultError: there is no frontend process, or none came back in time.
    """
    before = frontend_pids(server.process.pid)
    if not before:
        raise FaultError("api-kill: the server has no frontend processes")
    victim = before[turn % len(before)]
    t0 = time.monotonic()
    with contextlib.suppress(OSError):
        os.kill(victim, signal.SIGKILL)
    while time.monotonic() - t0 < API_BACK_TIMEOUT_S:
        await asyncio.sleep(0.1)
        now = frontend_pids(server.process.pid)
        if victim not in now and len(now) >= len(before):
            new = sorted(set(now) - set(before))
            return (
                f"API process pid {victim} killed, pid {new[0] if new else '?'} in its place "
                f"after {time.monotonic() - t0:.1f} s"
            )
    raise FaultError(
        f"api-kill: killed pid {victim}; no frontend took its place within "
        f"{API_BACK_TIMEOUT_S:.0f} s (now {frontend_pids(server.process.pid)})"
    )


async def _inject(
    fault: str, server: Server, targets: FaultTargets, stop_s: float, turn: int = 0
) -> str:
    """Inject one fault (see :mod:`servehall.bench.soak.faults`); what it acted on.
    ``turn`` counts the faults injected before this one (``api-kill`` takes turns over
    the frontends)."""
    if fault == "api-kill":
        return await kill_api_process(server, turn)
    if fault in ("worker-kill", "worker-stop"):
        pids = worker_pids(server.process.pid)
        if fault == "worker-kill":
            for p in pids:
                with contextlib.suppress(OSError):
                    os.kill(p, signal.SIGKILL)
        else:
            await stop_processes(pids, stop_s)
        return f"pids {pids}"
    if fault == "db-stop":
        assert targets.db_pid is not None
        pids = process_tree(targets.db_pid)
        await stop_processes(pids, stop_s)
        return f"postmaster {targets.db_pid} and {len(pids) - 1} children stopped {stop_s:g} s"
    if fault == "db-restart":
        if targets.db_restart_cmd:
            await asyncio.to_thread(run_shell, targets.db_restart_cmd, targets.log)
            return f"ran {targets.db_restart_cmd!r}"
        assert targets.db_pid is not None
        old = targets.db_pid
        _, targets.db_pid = await asyncio.to_thread(pg_ctl_restart, old, targets.log)
        return f"pg_ctl restart: postmaster {old} -> {targets.db_pid}"
    assert fault == "redis-restart" and targets.redis_restart_cmd
    await asyncio.to_thread(run_shell, targets.redis_restart_cmd, targets.log)
    return f"ran {targets.redis_restart_cmd!r}"


async def fault_targets(opts: SoakOptions, workdir: Path, out: TextIO) -> FaultTargets:
    """The processes and commands the faults act on; the postmaster is found from the
    database when a database fault needs it and ``--db-pid`` is not given."""
    targets = FaultTargets(
        db_pid=opts.db_pid,
        db_restart_cmd=opts.db_restart_cmd,
        redis_restart_cmd=opts.redis_restart_cmd,
        log=workdir / "faults.log",
    )
    needs_pid = "db-stop" in opts.faults or (
        "db-restart" in opts.faults and not opts.db_restart_cmd
    )
    if DB_FAULTS & set(opts.faults) and needs_pid and targets.db_pid is None:
        url = planned_database_url(opts)
        assert url is not None
        try:
            targets.db_pid = await postmaster_pid(url)
        except FaultError as exc:
            raise SoakError(str(exc)) from None
    if targets.db_pid is not None:
        print(f"database faults act on postmaster {targets.db_pid}", file=out)
    return targets
