"""The worker's test fault hook: a worker made to misbehave on purpose, for the tests of
supervision (:mod:`servehall.worker.supervisor`).

Honoured only when the environment variable ``SERVEHALL_TEST_WORKER_FAULT``
(:data:`FAULT_ENV`) is set, which only the test-suite does: ``KIND[@GEN[+]]`` applies
``KIND`` to the worker of generation ``GEN`` (1 = the first worker of a model; ``+`` =
that one and every later one; default ``@1``). Kinds:

* ``hang_step`` — after the first step output the engine's step never returns as far as
  the host can see (no more step output; heartbeats go on);
* ``stall_loop`` — after the first step output the worker's event loop is blocked once
  for :data:`STALL_LOOP_S` (as a loop starved of CPU would be; the engine goes on);
* ``wedge_loop`` — the same, for an hour;
* ``exit_after_ready`` — the worker exits with status :data:`EXIT_FAULT` right after
  reporting ready.

The serve loop (:class:`~servehall.worker.loop.WorkerLoop`) asks its :class:`FaultHook`
at two points only: after its ready report (:meth:`FaultHook.exit_after_ready`) and after
each step output it sent (:meth:`FaultHook.after_step`); while :attr:`FaultHook.hung` is
set it sends no step output.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time

log = logging.getLogger("servehall.worker")

FAULT_ENV = "SERVEHALL_TEST_WORKER_FAULT"
EXIT_FAULT = 7
STALL_LOOP_S = 1.5
WEDGE_LOOP_S = 3600.0


def parse_fault(value: str | None, generation: int) -> str | None:
    """The fault ``KIND`` that applies to ``generation`` under ``value`` (see module doc)."""
    if not value:
        return None
    kind, _, gen = value.partition("@")
    gen = gen or "1"
    later = gen.endswith("+")
    first = int(gen.rstrip("+"))
    applies = generation >= first if later else generation == first
    return kind if applies else None


class FaultHook:
    """The injected fault of one worker (none unless :data:`FAULT_ENV` names one for its
    generation).

    Args:
        kind: the fault ``KIND`` (see the module docstring), None for none.
    """

    def __init__(self, kind: str | None) -> None:
        self.kind = kind
        self.hung = False
        """The engine's step "hangs": the loop sends no more step output."""

    @classmethod
    def from_env(cls, generation: int) -> FaultHook:
        """The hook of the worker of ``generation`` under the environment's
        :data:`FAULT_ENV`."""
        return cls(parse_fault(os.environ.get(FAULT_ENV), generation))

    def exit_after_ready(self) -> bool:
        """Whether the worker exits (status :data:`EXIT_FAULT`) now that it reported
        ready (``exit_after_ready``)."""
        if self.kind != "exit_after_ready":
            return False
        log.error("test fault: exiting after ready")
        return True

    def after_step(self, loop: asyncio.AbstractEventLoop | None) -> None:
        """A step output was sent (any thread): ``hang_step`` sets :attr:`hung`;
        ``stall_loop`` / ``wedge_loop`` block ``loop`` once (a ``time.sleep`` scheduled
        on it)."""
        if self.kind == "hang_step" and not self.hung:
            log.error("test fault: the engine step hangs from now on")
            self.hung = True
        elif self.kind in ("stall_loop", "wedge_loop"):
            stall = STALL_LOOP_S if self.kind == "stall_loop" else WEDGE_LOOP_S
            self.kind = None
            log.error("test fault: the event loop stalls for %g s", stall)
            assert loop is not None
            loop.call_soon_threadsafe(time.sleep, stall)  # on the loop, any thread
