"""Child processes that die with their parent (Linux ``PR_SET_PDEATHSIG``).

Used by the supervised worker (:mod:`servehall.worker.bootstrap`) and by model converters
(:func:`servehall.engines.conversion.run_converter`): when the process that started
them is killed — even with SIGKILL, where no cleanup of its own runs — the kernel sends
them SIGKILL, so no orphan keeps a GPU, a port or a half-built cache entry busy.
The signal follows the *thread* that forked the child (prctl(2)), so the spawning
thread must outlive the child: both callers wait for the child on that thread or spawn
it from the event-loop thread.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1
"""``prctl`` option: the signal this process gets when its parent (thread) exits."""


def die_with_parent(parent_pid: int) -> None:
    """Ask Linux to SIGKILL this process when its parent dies; exit now if it already did.

    Call it in the child (e.g. as ``preexec_fn``). A no-op for the signal where
    ``prctl`` is missing (non-Linux); the parent check still runs.
    """
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent_pid:
        os._exit(1)
