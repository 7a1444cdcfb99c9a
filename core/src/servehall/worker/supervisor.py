"""The supervision of an engine worker process: :class:`WorkerSupervisor` spawns the
worker, reads its reports and its stderr, watches it, and restarts it.

Supervision (``[[models]] worker``, :class:`~servehall.config.worker.WorkerSettings`):

* the worker is watched for exit (its process sentinel, at once), and every 0.1 s for
  missed heartbeats and stalled steps (:mod:`servehall.worker.watch`: the verdict, with
  the kernel's view of a silent worker — stopped, busy, asleep);
* when it is lost, every in-flight request ends at once with ``finish_reason="error"``
  and ``code="engine_unavailable"`` (the host answers 503 + ``Retry-After``, or one SSE
  error event then ``[DONE]``); ``health()`` turns false with the reason;
* a new worker starts after ``restart_backoff_s`` (doubling per consecutive failure up
  to ``restart_backoff_max_s``); once it answers a one-token probe, the engine is up
  again. ``crash_loop_restarts`` failures within ``crash_loop_window_s`` stop the
  restarts: the model stays not ready with the last exit reason (signal name, OOM kill,
  last stderr lines);
* a worker that fails during start is not restarted: the engine's ``start`` raises
  ``ConfigError``/``EngineError`` with the worker's own message (no restart storm).

Each restart and crash loop is reported through ``on_event(action, details)`` (the host
writes an audit event) and counted in :attr:`WorkerSupervisor.restart_counts`.

One worker process with its connections and output is a
:class:`~servehall.worker.generation.Generation`; the supervisor decides when one starts,
is judged lost, is replaced, or is not replaced any more.

The engine client (:class:`~servehall.worker.client.ProcessEngine`) holds a supervisor
and is its :class:`WorkerClient`: the supervisor reaches the request side only through
that protocol (in-flight count, step and embedding delivery, failing in-flight work,
ending every request at shutdown, the probe, the ready report). Pattern: vLLM V1 keeps
its engine client and its process manager apart.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import multiprocessing
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

from servehall.config.models import ModelConfig
from servehall.config.worker import WorkerSettings
from servehall.errors import ConfigError, EngineError
from servehall.worker.bootstrap import WorkerSpec
from servehall.worker.exits import describe_exit, oom_kill_count, with_stderr
from servehall.worker.generation import Generation
from servehall.worker.messages import (
    EmbedOutput,
    Heartbeat,
    StartFailed,
    StepOutput,
    StopWorker,
    WorkerReady,
)
from servehall.worker.watch import OK, WorkerWatch

log = logging.getLogger("servehall.worker")

RESTART_REASONS = (
    "crashed",
    "oom_killed",
    "heartbeat_timeout",
    "stopped",
    "step_stalled",
    "start_failed",
    "probe_failed",
)
"""Label values of ``servehall_engine_restarts_total{reason}``."""

WATCH_INTERVAL_S = 0.1
STDERR_TAIL_LINES = 40

EventFn = Callable[[str, dict[str, Any]], None]


class WorkerClient(Protocol):
    """What the supervisor asks of the engine client that holds it (the request side:
    :class:`~servehall.worker.client.ProcessEngine`)."""

    def in_flight(self) -> int:
        """Requests in flight (the stall check's and its message's count)."""
        ...

    def on_step(self, msg: StepOutput) -> None:
        """Deliver one engine step's deltas to their streams."""
        ...

    def on_embed(self, msg: EmbedOutput) -> None:
        """Deliver one embedding answer to its caller."""
        ...

    def fail_in_flight(self) -> None:
        """End every in-flight request now (the worker is lost); drop queued commands."""
        ...

    def abort_all(self) -> None:
        """End every request: the engine is shutting down (no command is sent)."""
        ...

    async def probe(self) -> bool:
        """One inference through a freshly restarted worker; True when it finished."""
        ...

    def on_ready(self, info: WorkerReady) -> None:
        """A new worker reported ready with its engine's facts."""
        ...


class WorkerSupervisor:
    """Spawns, watches and restarts the worker process of one model (see the module
    docstring).

    Args:
        model: the ``[[models]]`` entry (its ``worker`` table tunes supervision unless
            ``settings`` is given).
        backend: the resolved backend name whose factory builds the engine in the worker.
        plugins: entry-point names the worker enables to find that backend.
        client: the request side it serves (see :class:`WorkerClient`).
        settings: supervision settings (default ``model.worker``).
        log_level: the worker's log level.
        on_event: ``(action, details)`` for ``restart`` and ``crash_loop``.
        prepare: the backend's :attr:`~servehall.BackendSpec.prepare` (a model
            conversion), run on a thread before the worker is spawned, outside its
            ``start_timeout_s``; the state reason says so meanwhile.
    """

    def __init__(
        self,
        model: ModelConfig,
        backend: str,
        plugins: Sequence[str],
        client: WorkerClient,
        *,
        settings: WorkerSettings | None = None,
        log_level: str = "info",
        on_event: EventFn | None = None,
        prepare: Callable[[ModelConfig], None] | None = None,
    ) -> None:
        self.client = client
        self._prepare = prepare
        self.name = model.name
        self.model = model
        self.backend = backend
        self.plugins = tuple(plugins)
        self.settings = settings or model.worker
        self.log_level = log_level
        self.on_event = on_event
        self.restart_counts: collections.Counter[str] = collections.Counter(
            dict.fromkeys(RESTART_REASONS, 0)
        )
        self._state = "new"  # new | starting | probing | up | down | failed | stopped
        self._reason = "engine not started"
        self._gen: Generation | None = None
        self._generations = 0
        self._tmp: str | None = None
        self._mp = multiprocessing.get_context("spawn")
        self._loop: asyncio.AbstractEventLoop | None = None
        self._up = asyncio.Event()
        self._hb: Heartbeat | None = None
        self._counters = (0, 0, 0)
        self.watch = WorkerWatch(self.name, self.settings)
        """When the worker was last heard from, and the verdict on it."""
        self._up_since = 0.0
        self._failures: collections.deque[float] = collections.deque()
        self._consecutive = 0
        self._watcher: asyncio.Task[None] | None = None
        self._restart: asyncio.Task[None] | None = None
        self._stderr: collections.deque[str] = collections.deque(maxlen=STDERR_TAIL_LINES)
        self.started_at = 0.0
        """Unix time the current worker came up (0 before any)."""
        self.last_exit_reason = ""
        """The kind (a :data:`RESTART_REASONS` value) of the last loss, "" before any."""
        self.oom_kills = 0
        """Workers killed by the OOM killer (``servehall_engine_oom_kills_total``)."""

    # --- state -------------------------------------------------------------------------

    @property
    def busy_silences(self) -> int:
        """Heartbeat silences forgiven because the worker was busy
        (``servehall_engine_busy_silences_total``): one per silence."""
        return self.watch.busy_silences

    @property
    def worker_up(self) -> bool:
        """The worker runs and serves requests (``servehall_engine_up``)."""
        return self._state == "up"

    @property
    def worker_pid(self) -> int | None:
        """The current worker's pid (None when none runs)."""
        gen = self._gen
        if gen is None or gen.proc is None or gen.proc.exitcode is not None:
            return None  # an exited worker's pid may already name another process
        return int(gen.proc.pid)

    @property
    def crash_looping(self) -> bool:
        """The supervisor gave up restarting (``servehall_engine_crash_loop``)."""
        return self._state == "failed"

    @property
    def state_reason(self) -> str:
        """Why the engine is not up ("" when it is)."""
        return "" if self._state == "up" else self._reason

    async def wait_up(self, timeout: float) -> bool:
        """Wait up to ``timeout`` s for the engine to be up; False when it is not (a crash
        loop or shutdown answers False at once)."""
        if self._state == "up":
            return True
        if self._state in ("failed", "stopped", "new"):
            return False
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await self._up.wait()
        return self._state == "up"

    @property
    def state(self) -> str:
        """``new``, ``starting``, ``probing``, ``up``, ``down``, ``failed`` or
        ``stopped``."""
        return self._state

    @property
    def heartbeat(self) -> Heartbeat | None:
        """The current worker's last heartbeat (None before its first)."""
        return self._hb

    @property
    def counters(self) -> tuple[int, int, int]:
        """Running, waiting, KV-cache blocks used: from the last step output or
        heartbeat, whichever came later."""
        return self._counters

    def start_stall_clock(self) -> None:
        """Work was queued with none in flight: the stalled-step check counts from now."""
        self.watch.stall_clock()

    def send(self, cmds: list[Any]) -> None:
        """Send ``cmds`` to the current worker as one frame (dropped when none is
        connected, see :meth:`~servehall.worker.generation.Generation.send`)."""
        if self._gen is not None:
            self._gen.send(cmds)

    # --- lifecycle ---------------------------------------------------------------------

    async def start(self) -> None:
        """Spawn the worker and wait until its engine started (``start_timeout_s``).

        Raises:
            ConfigError: the worker's backend factory refused the model (bad options,
                not a model directory), or its interpreter was refused, with its message.
            EngineError: the worker failed or died while starting (message with its exit
                reason and last stderr lines), or did not start in time.
        """
        if self._state != "new":
            return
        self._loop = asyncio.get_running_loop()
        self._tmp = tempfile.mkdtemp(prefix="servehall-worker-")
        if self.settings.python is not None:
            from servehall.worker.foreign import check_interpreter

            try:
                await check_interpreter(self.settings.python, self.name)
            except ConfigError:
                self._state = "stopped"
                self._reason = "the worker's interpreter was refused"
                shutil.rmtree(self._tmp, ignore_errors=True)
                self._tmp = None
                raise
        if self._prepare is not None:
            await self._run_prepare(self._prepare)
        try:
            await self._start_generation()
        except StartError as exc:
            await self._teardown_generation(kill=True)
            self._state = "stopped"
            self._reason = exc.message
            self._close_contexts()
            if exc.error_type == "ConfigError":
                raise ConfigError(f"model {self.name}: {exc.message}") from None
            raise EngineError(
                f"model {self.name}: the engine worker failed to start: {exc.message}"
            ) from None
        self._set_up()
        self._watcher = asyncio.ensure_future(self._watch_loop())

    async def _run_prepare(self, prepare: Callable[[ModelConfig], None]) -> None:
        """Run the backend's build step on a thread (see ``prepare`` in the class doc)."""
        self._reason = "building the model before its worker starts (conversion; see the log)"
        log.info("model %s: preparing the model before its worker starts", self.name)
        started = time.monotonic()
        try:
            await asyncio.to_thread(prepare, self.model)
        except (ConfigError, EngineError) as exc:
            self._state = "stopped"
            self._reason = str(exc)
            shutil.rmtree(self._tmp or "", ignore_errors=True)
            self._tmp = None
            if isinstance(exc, ConfigError):
                raise
            raise EngineError(f"model {self.name}: {exc}") from None
        log.info("model %s: prepared in %.1f s", self.name, time.monotonic() - started)
        self._reason = "engine not started"

    async def stop(self) -> None:
        """End every request (:meth:`WorkerClient.abort_all`), ask the worker to stop
        (SIGKILL after ``stop_timeout_s``). Idempotent."""
        if self._state == "stopped":
            return
        self._state = "stopped"
        self._reason = "engine is shut down"
        self._up.clear()
        self.client.abort_all()
        for task in (self._watcher, self._restart):
            if task is not None:
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task
        gen = self._gen
        if gen is not None and gen.proc is not None and gen.proc.exitcode is None:
            gen.send([StopWorker()])
            await gen.wait_exit(self.settings.stop_timeout_s)
        await self._teardown_generation(kill=True)
        self._close_contexts()

    def _close_contexts(self) -> None:
        """Remove the folder of the workers' socket paths."""
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None

    # --- one worker generation -----------------------------------------------------------

    async def _start_generation(self) -> None:
        """Spawn a worker and wait for its first heartbeat after ready (StartError)."""
        assert self._loop is not None and self._tmp is not None
        self._generations += 1
        gen = Generation(
            self._generations, name=self.name, stderr=self._stderr, on_report=self._on_report
        )
        self._gen = gen
        self._state = "starting"
        self._hb = None
        spec = WorkerSpec(
            model=self.model,
            backend=self.backend,
            plugins=self.plugins,
            socket_path=os.path.join(self._tmp, f"w-{gen.number}.sock"),
            parent_pid=os.getpid(),
            generation=gen.number,
            heartbeat_interval_s=self.settings.heartbeat_interval_s,
            loop_timeout_s=self.settings.loop_timeout_s,
            log_level=self.log_level,
            switch_interval_s=self.settings.switch_interval_s,
            stream_interval_s=self.settings.stream_interval_s,
            strict_plugins=self.settings.python is None,
        )
        gen.oom_before = oom_kill_count()
        # started on the event-loop thread: PR_SET_PDEATHSIG follows the spawning thread
        gen.spawn(
            self._loop,
            spec,
            mp=self._mp,
            python=self.settings.python,
            spec_path=Path(self._tmp) / f"spec-{gen.number}.json",
            on_exit=self._on_exit,
        )
        log.info(
            "model %s: worker %d started (pid %d, backend %s)",
            self.name,
            gen.number,
            gen.proc.pid,
            self.backend,
        )
        assert gen.ready is not None
        try:
            async with asyncio.timeout(self.settings.start_timeout_s):
                await gen.ready
        except TimeoutError:
            raise StartError(
                "", f"no ready report within start_timeout_s={self.settings.start_timeout_s:g}"
            ) from None
        assert gen.info is not None
        self.client.on_ready(gen.info)

    def _on_report(self, gen: Generation, msg: Any) -> None:
        if gen is not self._gen:
            return
        if isinstance(msg, StepOutput):
            self.watch.heard(progress=True)  # output is life too
            self._counters = msg.counters
            self.client.on_step(msg)
        elif isinstance(msg, EmbedOutput):
            self.watch.heard(progress=True)
            self.client.on_embed(msg)
        elif isinstance(msg, Heartbeat):
            self._hb = msg
            self._counters = (msg.running, msg.waiting, msg.kv_cache_blocks_used)
            self.watch.heard()
            if gen.info is not None and gen.ready is not None and not gen.ready.done():
                gen.ready.set_result(None)
        elif isinstance(msg, WorkerReady):
            gen.info = msg
        elif isinstance(msg, StartFailed) and gen.ready is not None and not gen.ready.done():
            gen.ready.set_exception(StartError(msg.error_type, msg.message))

    def _on_exit(self, gen: Generation) -> None:
        """The worker process ended (its sentinel became readable)."""
        if self._loop is not None and gen.proc is not None:
            self._loop.remove_reader(gen.proc.sentinel)
        if gen.proc is not None:
            gen.proc.join(2.0)  # the sentinel closes just before the exit status is ready
        if gen is not self._gen or self._state == "stopped":
            return
        gen.read_output()  # the last words, before composing the reason
        exit_reason = describe_exit(
            gen.proc.exitcode, oom_before=gen.oom_before, oom_after=oom_kill_count()
        )
        reason = with_stderr(f"worker {exit_reason}", self._stderr)
        if gen.ready is not None and not gen.ready.done():
            gen.failing = asyncio.ensure_future(self._fail_start(gen, reason))
            return
        kind = "oom_killed" if "OOM killer" in exit_reason else "crashed"
        self._lost(kind, reason)

    async def _fail_start(self, gen: Generation, reason: str) -> None:
        """The worker ended before it was ready. Its ``StartFailed`` report (written just
        before it exits with status 3) may still be unread in the reports socket when the
        exit is seen first: let the reader deliver what arrived (it ends at the socket's
        end; at most 2 s) so the worker's own error wins over "exited with status 3"."""
        if gen.reader is not None and not gen.reader.done():
            with contextlib.suppress(Exception):
                async with asyncio.timeout(2.0):
                    await asyncio.shield(gen.reader)
        if gen.ready is not None and not gen.ready.done():
            gen.ready.set_exception(StartError("", reason))

    async def _teardown_generation(self, *, kill: bool) -> None:
        if self._gen is not None:
            await self._gen.teardown(kill=kill)

    # --- supervision -------------------------------------------------------------------

    def _set_up(self) -> None:
        self._state = "up"
        self._reason = ""
        self._up_since = time.monotonic()
        self.started_at = time.time()
        self.watch.heard()
        self._up.set()

    async def _watch_loop(self) -> None:
        interval = min(WATCH_INTERVAL_S, self.settings.heartbeat_interval_s)
        while True:
            asleep = time.monotonic()
            await asyncio.sleep(interval)
            self.watch.woke(asleep, time.monotonic(), interval)
            self._judge()

    def _judge(self) -> None:
        """One look at the worker: exited, lost (:meth:`WorkerWatch.judge
        <servehall.worker.watch.WorkerWatch.judge>`), or up long enough."""
        if self._state not in ("up", "probing"):
            return
        gen = self._gen
        if gen is not None and gen.proc is not None and gen.proc.exitcode is not None:
            self._on_exit(gen)
            return
        verdict = self.watch.judge(gen, self.client.in_flight())
        if verdict.lost:
            self._lost(verdict.kind, verdict.reason)
        elif (
            verdict is OK
            and self._consecutive
            and time.monotonic() - self._up_since > self.settings.crash_loop_window_s
        ):
            self._consecutive = 0  # stayed up long enough: back to the first delay

    def _lost(self, kind: str, reason: str) -> None:
        """The worker failed (any state): end in-flight work, restart or give up."""
        if self._state in ("stopped", "failed", "down"):
            return
        log.error("model %s: %s", self.name, reason)
        self.last_exit_reason = kind
        if kind == "oom_killed":
            self.oom_kills += 1
        self._state = "down"
        self._reason = reason
        self._up.clear()
        gen = self._gen
        if gen is not None and gen.proc is not None and gen.proc.exitcode is None:
            with contextlib.suppress(Exception):
                gen.proc.kill()  # a hung or silent worker is replaced, not waited for
        self.client.fail_in_flight()
        now = time.monotonic()
        window = self.settings.crash_loop_window_s
        self._failures.append(now)
        while self._failures and now - self._failures[0] > window:
            self._failures.popleft()
        if len(self._failures) > self.settings.crash_loop_restarts:
            self._state = "failed"
            self._reason = (
                f"crash loop: {len(self._failures)} worker failure(s) within {window:g} s, "
                f"not restarting; last: {reason}"
            )
            log.error("model %s: %s", self.name, self._reason)
            self._event("crash_loop", {"reason": reason, "kind": kind})
            self._restart = asyncio.ensure_future(self._teardown_generation(kill=True))
            return
        s = self.settings
        delay = min(s.restart_backoff_s * (2**self._consecutive), s.restart_backoff_max_s)
        self._consecutive += 1
        self.restart_counts[kind] += 1
        self._reason = f"restarting in {delay:g} s after: {reason}"
        self._event(
            "restart",
            {"reason": reason, "kind": kind, "delay_s": delay, "generation": self._generations + 1},
        )
        self._restart = asyncio.ensure_future(self._restart_after(delay, reason))

    async def _restart_after(self, delay: float, cause: str) -> None:
        await self._teardown_generation(kill=True)
        await asyncio.sleep(delay)
        if self._state != "down":
            return
        self._reason = f"restarting after: {cause}"
        try:
            await self._start_generation()
        except StartError as exc:
            self._state = "starting"
            self._lost("start_failed", f"restarted worker failed to start: {exc.message}")
            return
        self._state = "probing"
        self.watch.heard()
        if not await self.client.probe():
            if self._state == "probing":
                self._state = "starting"
                self._lost("probe_failed", "restarted worker failed its probe inference")
            return
        self._set_up()
        log.info("model %s: worker %d is up again", self.name, self._generations)

    def _event(self, action: str, details: dict[str, Any]) -> None:
        if self.on_event is None:
            return
        try:
            self.on_event(action, {"model": self.name, **details})
        except Exception:
            log.exception("model %s: the %s event handler failed", self.name, action)


class StartError(Exception):
    """A worker did not start: ``error_type`` from its StartFailed report (or "")."""

    def __init__(self, error_type: str, message: str) -> None:
        super().__init__(message)
        self.error_type = error_type
        self.message = message
