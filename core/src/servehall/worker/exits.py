"""Why a worker process ended, in words an operator can act on.

* the exit status or the signal's name (``killed by SIGSEGV``), from
  ``multiprocessing.Process.exitcode`` (negative = killed by that signal);
* ``killed by the kernel's OOM killer`` when SIGKILL coincides with a rise of the
  ``oom_kill`` counter in this cgroup's ``memory.events`` (cgroup v2), the kernel's own
  account of OOM kills — no guessing from the signal alone;
* the last lines the worker wrote to stderr (Python tracebacks, device runtime messages).
"""

from __future__ import annotations

import signal
from collections.abc import Iterable
from pathlib import Path


def _cgroup_dir() -> Path | None:
    try:
        text = Path("/proc/self/cgroup").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("0::"):
            return Path("/sys/fs/cgroup") / line[3:].lstrip("/")
    return None


def oom_kill_count() -> int | None:
    """The ``oom_kill`` counter of this process's cgroup (v2), or None where unreadable."""
    d = _cgroup_dir()
    if d is None:
        return None
    try:
        for line in (d / "memory.events").read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
    except (OSError, ValueError):
        return None
    return None


def signal_name(signum: int) -> str:
    """``SIGKILL`` for 9; ``signal 77`` for a number without a name."""
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def describe_exit(
    exitcode: int | None,
    *,
    oom_before: int | None = None,
    oom_after: int | None = None,
) -> str:
    """One phrase for a worker's end: ``exited with status 3``, ``killed by SIGSEGV``,
    ``killed by the kernel's OOM killer (SIGKILL)``, or ``still running``."""
    if exitcode is None:
        return "still running"
    if exitcode >= 0:
        return f"exited with status {exitcode}"
    name = signal_name(-exitcode)
    if (
        -exitcode == signal.SIGKILL
        and oom_before is not None
        and oom_after is not None
        and oom_after > oom_before
    ):
        return f"killed by the kernel's OOM killer ({name})"
    return f"killed by {name}"


def with_stderr(reason: str, lines: Iterable[str], keep: int = 5) -> str:
    """``reason`` followed by the last ``keep`` non-blank stderr lines (`` | ``-joined)."""
    tail = [line.strip() for line in lines if line.strip()][-keep:]
    if not tail:
        return reason
    return f"{reason}; last stderr: " + " | ".join(t[:300] for t in tail)
