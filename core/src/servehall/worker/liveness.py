"""What a silent worker process is doing, read from ``/proc``: the watch's second look
before the supervisor restarts a worker whose heartbeats are overdue
(:class:`~servehall.worker.watch.WorkerWatch`).

A missed heartbeat has three causes that look the same from the socket: the worker is
**stopped** (SIGSTOP, a debugger: it will not answer again by itself), **busy** (alive,
but starved of CPU by other processes, or computing with the GIL held while it loads,
compiles or tokenizes: it will answer once it gets the CPU), or **asleep** (every thread
waits and nothing runs: a wedged event loop whose heartbeat thread stopped vouching for
it, a deadlock). :func:`liveness` tells them apart from the kernel's view of the process:

* ``stopped``: the process's state is ``T`` or ``t`` (``/proc/<pid>/stat``, field 3);
* ``busy``: some thread is runnable or in an uninterruptible wait (``R`` or ``D`` in
  ``/proc/<pid>/task/<tid>/stat``: it wants the CPU or is in a device or disk call), or
  the process's CPU time (``utime + stime``, fields 14 and 15, all threads, in clock
  ticks) advanced since the previous sample;
* ``asleep``: none of these;
* ``unknown``: no ``/proc`` (not Linux) or the process is gone or a zombie: the caller
  keeps its plain timeout.

Reading these files costs a few system calls; the supervisor reads them only while a
heartbeat is overdue.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Literal

Verdict = Literal["stopped", "busy", "asleep", "unknown"]
"""The four answers of :func:`liveness` (module docstring)."""

_STOPPED = frozenset("Tt")
_WORKING = frozenset("RD")
_GONE = frozenset("ZXx")


@dataclass(frozen=True, slots=True)
class ProcSample:
    """One look at a process in ``/proc``.

    Attributes:
        state: the state letter of the process (its main thread), e.g. ``"S"``.
        working: some thread of the process is runnable (``R``) or in an uninterruptible
            wait (``D``).
        cpu_ticks: user plus system CPU time of all its threads, in clock ticks
            (``os.sysconf("SC_CLK_TCK")`` per second, usually 100).
    """

    state: str
    working: bool
    cpu_ticks: int


def _stat_fields(path: str) -> list[str] | None:
    """The fields of a ``stat`` file after the command name (field 3 onward), None when
    it cannot be read. The name (field 2) may hold spaces and parentheses: the fields
    start after its last ``)``."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError:
        return None
    _, sep, rest = raw.rpartition(b")")
    fields = rest.split()
    return [x.decode() for x in fields] if sep and len(fields) >= 13 else None


def sample(pid: int, proc: str = "/proc") -> ProcSample | None:
    """Read process ``pid``'s state, its threads' states and its CPU time.

    Args:
        pid: the process id.
        proc: where procfs is mounted (tests).

    Returns:
        The sample, or None when there is no such file (not Linux, the process is gone).
    """
    fields = _stat_fields(f"{proc}/{pid}/stat")
    if fields is None:
        return None
    state = fields[0]
    try:
        ticks = int(fields[11]) + int(fields[12])  # utime, stime (fields 14, 15)
    except ValueError:
        return None
    working = state in _WORKING
    if not working:
        try:
            tids = os.listdir(f"{proc}/{pid}/task")
        except OSError:
            tids = []
        for tid in tids:
            thread = _stat_fields(f"{proc}/{pid}/task/{tid}/stat")
            if thread is not None and thread[0] in _WORKING:
                working = True
                break
    return ProcSample(state, working, ticks)


def liveness(
    pid: int, previous: ProcSample | None = None, proc: str = "/proc"
) -> tuple[Verdict, ProcSample | None]:
    """Judge a silent process (module docstring).

    Args:
        pid: the worker's process id.
        previous: the sample of the previous look at the same silence, if any: CPU time
            spent since then also counts as busy.
        proc: where procfs is mounted (tests; a missing folder answers ``unknown``).

    Returns:
        ``(verdict, sample)``: pass ``sample`` as ``previous`` to the next call.
    """
    now = sample(pid, proc)
    if now is None or now.state in _GONE:
        return "unknown", now
    if now.state in _STOPPED:
        return "stopped", now
    if now.working or (previous is not None and now.cpu_ticks > previous.cpu_ticks):
        return "busy", now
    return "asleep", now
