"""The soak's declared faults: what each one does, which deployments allow it, and how.

* ``worker-kill``: SIGKILL the engine worker (the supervisor restarts it).
* ``worker-stop``: SIGSTOP the worker for ``--fault-stop`` seconds (default
  :data:`STOP_S`; the heartbeat check
  restarts it), then SIGCONT.
* ``db-stop``: SIGSTOP the PostgreSQL server — the postmaster and every process under it
  — for ``--fault-stop`` seconds, then SIGCONT. The postmaster is ``--db-pid``, or found
  from the soak's database: the parent of the backend that answers
  ``SELECT pg_backend_pid()`` (the server must run on this machine).
* ``db-restart``: restart the PostgreSQL server: ``--db-restart-cmd`` (a shell command),
  or ``pg_ctl restart -m fast`` on the postmaster's data directory (its working
  directory), run as the data directory's owner — the new postmaster's pid is read back
  from ``postmaster.pid``.
* ``api-kill``: SIGKILL one HTTP frontend process (``[server] api_processes`` = N > 1,
  ``--api-processes``: the children of the serve process running
  ``-m servehall.server.frontend``); the serve process starts it again. The streams of
  the connections it held are cut (the clients see a transport error, the server records
  each such request as a client that left); the other frontends' streams go on.
* ``redis-restart``: run ``--redis-restart-cmd`` (a shell command; there is no portable
  way to restart a Redis from outside); only for a deployment that uses Redis (``[server]
  config_broadcast_url`` or a plugin's Redis URL such as ``[auth] limits_url``).

A database fault is refused for SQLite (a file has no server to stop), and every fault
needs a server the soak starts itself. :func:`check_faults` says why, in one line.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pwd
import signal
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

FAULTS = ("worker-kill", "worker-stop", "db-stop", "db-restart", "redis-restart", "api-kill")
"""Every fault ``--faults`` accepts (see the module docstring)."""

DB_FAULTS = frozenset({"db-stop", "db-restart"})
STOP_S = 5.0
"""How long ``worker-stop`` and ``db-stop`` keep their processes stopped by default
(seconds; ``--fault-stop``)."""


class FaultError(Exception):
    """A fault cannot be declared or injected here; one line for the user."""


@dataclass
class FaultTargets:
    """What the faults act on, beyond the server the soak starts.

    Attributes:
        db_pid: the PostgreSQL postmaster (``db-stop``; ``db-restart`` without a
            command); updated after a ``pg_ctl`` restart.
        db_restart_cmd: shell command restarting the database server.
        redis_restart_cmd: shell command restarting the Redis server.
        log: file the restart commands' output goes to (None: discarded).
    """

    db_pid: int | None = None
    db_restart_cmd: str | None = None
    redis_restart_cmd: str | None = None
    log: Path | None = None


def database_kind(url: str | None) -> str | None:
    """``"sqlite"``, ``"postgresql"``, another dialect's name, or None for no URL."""
    if not url:
        return None
    return url.split(":", 1)[0].split("+", 1)[0].lower()


def redis_urls(settings: Any) -> list[str]:
    """Where a config points at Redis: ``server.config_broadcast_url`` and any plugin
    option named ``*url`` whose value is a Redis URL (or a secret reference, e.g. the
    auth plugin's ``limits_url = {file = …}``). Names, not values (they may hold a
    password)."""
    out = []
    if getattr(settings.server, "config_broadcast_url", None) is not None:
        out.append("server.config_broadcast_url")

    def walk(prefix: str, value: Any) -> None:
        if hasattr(value, "model_dump"):
            value = value.model_dump()
        if not isinstance(value, Mapping):
            return
        for k, v in value.items():
            name = f"{prefix}.{k}"
            if str(k).endswith("url") and v is not None:
                text = v.get_secret_value() if hasattr(v, "get_secret_value") else v
                if isinstance(text, Mapping) or (
                    isinstance(text, str) and text.startswith(("redis://", "rediss://", "unix://"))
                ):
                    out.append(name)
            else:
                walk(name, v)

    for section, value in settings.plugin_sections.items():
        walk(section, value)
    return out


def check_faults(
    faults: Sequence[str],
    *,
    starts_server: bool,
    db_url: str | None,
    redis: Sequence[str] = (),
    db_pid: int | None = None,
    redis_restart_cmd: str | None = None,
    stop_s: float = STOP_S,
    api_processes: int = 1,
) -> None:
    """Refuse faults this deployment cannot have, with a one-line reason.

    Args:
        faults: the ``--faults`` values.
        starts_server: the soak starts the server (no ``--url``).
        db_url: the database the server writes to (None: unknown).
        redis: where the config uses Redis (:func:`redis_urls`).
        db_pid, redis_restart_cmd: the options of the same names.
        stop_s: ``--fault-stop``, seconds a stop fault lasts.
        api_processes: ``--api-processes`` of the server the soak starts.

    Raises:
        FaultError: an unknown fault, a fault without a server the soak starts, a
            database fault on SQLite or an unknown database, ``redis-restart`` without
            Redis in the config or without ``--redis-restart-cmd``, ``api-kill`` with
            fewer than 2 API processes.
    """
    for f in faults:
        if f not in FAULTS:
            raise FaultError(f"unknown fault {f!r}; known: {', '.join(FAULTS)}")
    if not faults:
        return
    if not starts_server:
        raise FaultError("--faults needs a server the soak starts (no --url)")
    if DB_FAULTS & set(faults):
        which = "/".join(sorted(DB_FAULTS & set(faults)))
        kind = database_kind(db_url)
        if kind == "sqlite":
            raise FaultError(
                f"{which} needs a PostgreSQL server; this deployment's database is SQLite "
                "(a file: nothing to stop or restart). Give --config with a postgresql "
                "[database] url"
            )
        if kind != "postgresql":
            raise FaultError(
                f"{which} needs a PostgreSQL database; the soak's is "
                f"{kind or 'unknown'} (give --config with a postgresql [database] url)"
            )
    if not 0 < stop_s <= 600:
        raise FaultError(f"--fault-stop must be in (0, 600] seconds (got {stop_s:g})")
    if db_pid is not None and db_pid <= 0:
        raise FaultError(f"--db-pid must be a process id (got {db_pid})")
    if "api-kill" in faults and api_processes < 2:
        raise FaultError(
            "api-kill needs frontend processes to kill: give --api-processes 2 or more "
            f"(got {api_processes}: the serve process answers HTTP itself)"
        )
    if "redis-restart" in faults:
        if not redis:
            raise FaultError(
                "redis-restart: this deployment uses no Redis (no [server] "
                "config_broadcast_url, no plugin Redis URL such as [auth] limits_url)"
            )
        if not redis_restart_cmd:
            raise FaultError(
                "redis-restart needs --redis-restart-cmd (the shell command that restarts "
                f"the Redis of {', '.join(redis)})"
            )


async def postmaster_pid(db_url: str) -> int:
    """The PID of the PostgreSQL postmaster serving ``db_url``: the parent of the backend
    that answers ``SELECT pg_backend_pid()``. FaultError when the server is not a local
    process this soak can see."""
    from sqlalchemy import text

    from servehall.db.engine import create_db_engine

    engine = create_db_engine(db_url)
    status: str | None = None
    try:
        async with engine.connect() as conn:
            backend = int((await conn.execute(text("SELECT pg_backend_pid()"))).scalar_one())
            # read while the connection is open: the backend exits when it closes
            with contextlib.suppress(OSError):
                status = Path(f"/proc/{backend}/status").read_text()
    except Exception as exc:
        raise FaultError(f"db faults: cannot ask the database for its pid: {exc}") from None
    finally:
        await engine.dispose()
    if status is None:
        raise FaultError(
            f"db faults: the database's backend pid {backend} is not a process on this "
            "machine (a remote or containerised server); give --db-pid or --db-restart-cmd"
        ) from None
    ppid = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("PPid:"))
    if "postgres" not in _cmdline(ppid):
        raise FaultError(f"db faults: pid {ppid} (parent of the backend) is not postgres")
    return ppid


def _cmdline(pid: int) -> str:
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    return ""


def _signal_all(pids: Iterable[int], sig: signal.Signals) -> None:
    for p in pids:
        with contextlib.suppress(OSError):
            os.kill(p, sig)


async def stop_processes(pids: Sequence[int], seconds: float) -> None:
    """SIGSTOP ``pids``, wait ``seconds``, SIGCONT them (also when cancelled)."""
    _signal_all(pids, signal.SIGSTOP)
    try:
        await asyncio.sleep(seconds)
    finally:
        _signal_all(pids, signal.SIGCONT)


def pg_ctl_restart(postmaster: int, log: Path | None = None) -> tuple[list[str], int]:
    """Restart the PostgreSQL server of ``postmaster`` with ``pg_ctl restart -m fast -w``
    on its data directory, as the directory's owner (``runuser`` when this is root).

    Returns:
        (the command run, the new postmaster's pid from ``postmaster.pid``).

    Raises:
        FaultError: the process, its data directory or ``pg_ctl`` cannot be found, or
            ``pg_ctl`` failed.
    """
    try:
        data = Path(os.readlink(f"/proc/{postmaster}/cwd"))
        bindir = Path(os.readlink(f"/proc/{postmaster}/exe")).parent
    except OSError as exc:
        raise FaultError(f"db-restart: cannot inspect postmaster {postmaster}: {exc}") from None
    pg_ctl = bindir / "pg_ctl"
    if not (data / "PG_VERSION").exists() or not pg_ctl.exists():
        raise FaultError(
            f"db-restart: no data directory at {data} or no {pg_ctl}; give --db-restart-cmd"
        )
    cmd = [str(pg_ctl), "-D", str(data), "-m", "fast", "-w", "-t", "60", "restart"]
    owner = data.stat().st_uid
    if os.geteuid() == 0 and owner != 0:
        cmd = ["runuser", "-u", pwd.getpwuid(owner).pw_name, "--", *cmd]
    out = log.open("ab") if log is not None else None
    try:
        # the new server inherits stdout/stderr: a file (or /dev/null), never a pipe
        proc = subprocess.run(
            cmd,
            cwd="/",
            stdin=subprocess.DEVNULL,
            stdout=out or subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
            timeout=120,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise FaultError(f"db-restart: {' '.join(cmd)}: {exc}") from None
    finally:
        if out is not None:
            out.close()
    if proc.returncode != 0:
        raise FaultError(f"db-restart: {' '.join(cmd)} exited with {proc.returncode}")
    try:
        pid = int((data / "postmaster.pid").read_text().split()[0])
    except (OSError, ValueError, IndexError) as exc:
        raise FaultError(f"db-restart: no new postmaster.pid in {data}: {exc}") from None
    return cmd, pid


def run_shell(cmd: str, log: Path | None = None) -> None:
    """Run a restart command (``sh -c``); FaultError when it fails or takes over 120 s."""
    out = log.open("ab") if log is not None else None
    try:
        proc = subprocess.run(
            cmd,
            shell=True,
            stdin=subprocess.DEVNULL,
            stdout=out or subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
            timeout=120,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise FaultError(f"{cmd!r}: {exc}") from None
    finally:
        if out is not None:
            out.close()
    if proc.returncode != 0:
        raise FaultError(f"{cmd!r} exited with {proc.returncode}")
