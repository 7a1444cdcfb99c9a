"""The watch on a running engine worker (API-process side): when a worker that has not
exited counts as lost.

:class:`WorkerWatch` keeps when the current worker was last heard from (any report) and
last made progress (step or embedding output), and :meth:`WorkerWatch.judge` gives the
verdict the supervisor (:class:`~servehall.worker.supervisor.WorkerSupervisor`) acts on,
every ``0.1`` s (:data:`~servehall.worker.supervisor.WATCH_INTERVAL_S`):

* missed heartbeats (no report at all for ``heartbeat_timeout_s``; the worker sends them
  from a thread of its own, so a busy worker event loop is not mistaken for a dead one)
  are judged with the kernel's view of the worker (:mod:`servehall.worker.liveness`): a
  stopped worker (SIGSTOP) is lost (``stopped``); a busy one (starved of CPU, or
  computing) is forgiven up to ``busy_timeout_s`` (counted in
  :attr:`WorkerWatch.busy_silences`); an asleep one is lost (``heartbeat_timeout``);
* stalled steps (requests in flight but no output for ``step_timeout_s``) are lost
  (``step_stalled``);
* no verdict is given while this process itself was behind: reports wait unread in the
  reports socket, or this process was not running for a while (:meth:`WorkerWatch.woke`:
  the worker then gets two heartbeat intervals to be heard).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from servehall.config.worker import WorkerSettings
from servehall.worker.generation import Generation
from servehall.worker.liveness import ProcSample, liveness

log = logging.getLogger("servehall.worker")


@dataclass(frozen=True, slots=True)
class Verdict:
    """One look at a worker.

    Attributes:
        kind: ``"ok"``; ``"behind"`` (this process was behind, not the worker: its
            reports are read first); or the lost worker's restart reason
            (``stopped``, ``heartbeat_timeout``, ``step_stalled``).
        reason: why it is lost ("" unless lost).
    """

    kind: str
    reason: str = ""

    @property
    def lost(self) -> bool:
        """The worker is lost (a restart reason)."""
        return self.kind not in ("ok", "behind")


OK = Verdict("ok")
BEHIND = Verdict("behind")


class WorkerWatch:
    """Heard-from and progress times of one model's current worker, and the verdict on
    them (see the module docstring).

    Args:
        name: the model's name (for logs).
        settings: the supervision settings (timeouts).
    """

    def __init__(self, name: str, settings: WorkerSettings) -> None:
        self.name = name
        self.settings = settings
        self.last_heard = 0.0
        """When the worker was last heard from (``time.monotonic()``)."""
        self.last_progress = 0.0
        """When the worker last made progress, or work was queued with none in flight."""
        self.grace_until = 0.0
        """No heartbeat verdict before this (``time.monotonic()``)."""
        self.busy_silences = 0
        """Heartbeat silences forgiven because the worker was busy
        (``servehall_engine_busy_silences_total``): one per silence."""
        self._silence_sample: tuple[float, ProcSample | None] = (-1.0, None)
        self._forgiven = -1.0  # the last_heard of the silence last forgiven as busy

    def heard(self, *, progress: bool = False) -> None:
        """The worker was heard from now (with output: ``progress``)."""
        now = time.monotonic()
        self.last_heard = now
        if progress:
            self.last_progress = now

    def stall_clock(self) -> None:
        """Work was queued with none in flight: the stalled-step check counts from now."""
        self.last_progress = time.monotonic()

    def woke(self, asleep: float, now: float, interval: float) -> None:
        """The watch slept from ``asleep`` to ``now`` for ``interval`` s: when it slept
        much longer, this process was not running (a stopped or starved machine, a
        blocked loop): the worker may have been frozen with it, so it gets two of its
        heartbeat intervals to be heard before its silence is judged."""
        beat = self.settings.heartbeat_interval_s
        if now - asleep > interval + beat:
            self.grace_until = now + 2 * beat

    def judge(self, gen: Generation | None, in_flight: int) -> Verdict:
        """The verdict on the running worker of ``gen`` with ``in_flight`` requests."""
        s = self.settings
        now = time.monotonic()
        silent = now - self.last_heard
        stalled = in_flight > 0 and now - self.last_progress > s.step_timeout_s
        if (silent > s.heartbeat_timeout_s or stalled) and (
            now < self.grace_until or (gen is not None and gen.reports_pending())
        ):
            return BEHIND  # this process was behind, not the worker: read its reports first
        verdict = "unknown"
        if silent > s.heartbeat_timeout_s / 2 and gen is not None and gen.proc is not None:
            verdict = self._look(gen.proc.pid)
        if silent > s.heartbeat_timeout_s and verdict == "stopped":
            return Verdict("stopped", f"worker stopped (SIGSTOP?) and silent for {silent:.1f} s")
        if silent > max(s.heartbeat_timeout_s, s.busy_timeout_s) and verdict == "busy":
            return Verdict(
                "heartbeat_timeout",
                f"worker missed heartbeats for {silent:.1f} s while busy "
                f"(busy_timeout_s={s.busy_timeout_s:g})",
            )
        if silent > s.heartbeat_timeout_s and verdict != "busy":
            return Verdict("heartbeat_timeout", f"worker missed heartbeats for {silent:.1f} s")
        if stalled:
            return Verdict(
                "step_stalled",
                f"engine step stalled: no output for {now - self.last_progress:.1f} s "
                f"with {in_flight} request(s) in flight",
            )
        return OK

    def _look(self, pid: int) -> str:
        """The liveness verdict on the silent worker ``pid``; counts and logs a silence
        forgiven as busy once (the CPU-time baseline is the previous look at the same
        silence)."""
        since, previous = self._silence_sample
        verdict, sample = liveness(pid, previous if since == self.last_heard else None)
        self._silence_sample = (self.last_heard, sample)
        silent = time.monotonic() - self.last_heard
        if (
            verdict == "busy"
            and silent > self.settings.heartbeat_timeout_s
            and self._forgiven != self.last_heard
        ):
            self._forgiven = self.last_heard
            self.busy_silences += 1
            log.warning(
                "model %s: worker silent for %.1f s but busy (starved of CPU or computing): "
                "not restarted before busy_timeout_s=%g",
                self.name,
                silent,
                self.settings.busy_timeout_s,
            )
        return verdict
