"""The start of an engine worker process (child side): what it is given
(:class:`WorkerSpec`) and how the process is set up before its serve loop
(:class:`~servehall.worker.loop.WorkerLoop`) runs.

:func:`worker_main` is the target of the ``spawn``-started process (and of a worker
under another interpreter, :mod:`servehall.worker.foreign`). It points its
stdout/stderr at the pipe the API process reads (so C-level messages of the device
runtime are captured too: the supervisor keeps their last lines for the exit reason),
arranges to die with its parent (``prctl(PR_SET_PDEATHSIG, SIGKILL)`` on Linux, plus a
parent-pid check with every heartbeat), leads a process group of its own watched by a
guard (:func:`guard_group`), and ignores SIGINT and SIGTERM (a terminal's Ctrl-C reaches
the whole process group, systemd signals the whole cgroup: the API process drains first,
then stops its workers); then it runs the serve loop and exits with its status.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
from dataclasses import dataclass
from multiprocessing.connection import Connection

from servehall.config.models import ModelConfig
from servehall.engines.child import die_with_parent
from servehall.worker.loop import WorkerLoop

log = logging.getLogger("servehall.worker")


@dataclass(frozen=True, slots=True)
class WorkerSpec:
    """What a worker needs to build its engine (pickled to the spawned process).

    Attributes:
        model: the ``[[models]]`` entry.
        backend: the resolved backend name (never ``"auto"``).
        plugins: entry-point names to enable (``[plugins] enabled``).
        socket_path: the Unix socket the API process listens on (the worker connects
            twice: commands, then reports).
        parent_pid: the API process's pid (the worker exits when it changes).
        generation: 1 for a model's first worker, +1 per restart.
        heartbeat_interval_s: seconds between heartbeats.
        loop_timeout_s: a health snapshot older than this is not sent (the loop is
            wedged: the host is to notice the silence).
        log_level: ``[server] log_level``.
        switch_interval_s: ``sys.setswitchinterval`` of the worker process, None for
            Python's default (see :class:`~servehall.config.worker.WorkerSettings`).
        stream_interval_s: least seconds between two step messages sent from the
            engine's step thread (see :class:`~servehall.config.worker.WorkerSettings`).
        strict_plugins: refuse to start when an enabled plugin cannot load (False for a
            worker under another interpreter, ``worker.python``: that environment holds
            the backend's engine, not necessarily every plugin of the API process).
    """

    model: ModelConfig
    backend: str
    plugins: tuple[str, ...]
    socket_path: str
    parent_pid: int
    generation: int
    heartbeat_interval_s: float
    loop_timeout_s: float = 10.0
    log_level: str = "info"
    switch_interval_s: float | None = None
    stream_interval_s: float = 0.0
    strict_plugins: bool = True


GUARD_INTERVAL_S = 0.5


def guard_group() -> None:
    """Start the process-group guard: a tiny shell in this worker's process group that
    SIGKILLs the whole group once this worker is gone, however it went (SIGKILL included).

    Processes an engine starts under the worker — vLLM's engine core and its workers —
    do not die with their parent (seen: a vLLM engine core left running with parent 1
    after its parent was killed), and ``PR_SET_PDEATHSIG`` reaches only direct children
    that set it themselves. The supervisor also kills the group when it replaces a worker;
    the guard covers the case where the supervisor itself is gone (the host was
    SIGKILLed: this worker then dies by its own ``PR_SET_PDEATHSIG``). It polls the
    worker's pid every :data:`GUARD_INTERVAL_S` (a pipe would be inherited by forked
    engine processes and never close). Linux/POSIX only; a missing ``/bin/sh`` only logs.
    """
    import subprocess

    script = (
        f"while kill -0 {os.getpid()} 2>/dev/null; do sleep {GUARD_INTERVAL_S}; done; kill -9 0"
    )
    try:
        subprocess.Popen(
            ["/bin/sh", "-c", script],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
    except OSError as exc:
        log.warning("no process-group guard for this worker: %s", exc)


def apply_switch_interval(spec: WorkerSpec) -> None:
    """Set this process's ``sys.setswitchinterval`` to ``spec.switch_interval_s`` (None:
    leave Python's 5 ms).

    With an engine whose ``step()`` holds the GIL for the whole step (OpenVINO GenAI's
    does), the event loop that ships its tokens waits for the GIL up to the switch
    interval after every socket operation.
    """
    if spec.switch_interval_s is not None:
        sys.setswitchinterval(spec.switch_interval_s)


def worker_main(spec: WorkerSpec, output: Connection | None) -> None:
    """Entry point of the worker process (see the module docstring). ``output`` is the
    pipe for stdout and stderr; None when they already point there (a worker under
    another interpreter, :mod:`servehall.worker.foreign`)."""
    if output is not None:
        fd = output.fileno()
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        output.close()
    die_with_parent(spec.parent_pid)
    # a process group of its own: the host SIGKILLs the whole group when it stops or
    # replaces this worker, so processes an engine starts (vLLM's engine core) go with it
    with contextlib.suppress(OSError):
        os.setpgid(0, 0)
    guard_group()
    # the host decides when workers stop (after draining); they die with it (above)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    logging.basicConfig(
        format=f"%(asctime)s %(levelname)s worker[{spec.model.name}] %(name)s: %(message)s",
        stream=sys.stderr,
        force=True,
    )
    logging.getLogger().setLevel(spec.log_level.upper())
    apply_switch_interval(spec)
    code = asyncio.run(WorkerLoop(spec).run())
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
