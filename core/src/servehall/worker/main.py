"""The engine worker process: one model's engine, driven over two Unix sockets (child
side; the transport: :mod:`servehall.worker.wire`).

:func:`worker_main` is the target of the ``spawn``-started process. It:

1. points its stdout/stderr at the pipe the API process reads (so C-level messages of
   the device runtime are captured too: the supervisor keeps their last lines for the
   exit reason), arranges to die with its parent (``prctl(PR_SET_PDEATHSIG, SIGKILL)`` on
   Linux, plus a parent-pid check with every heartbeat) and ignores SIGINT and SIGTERM
   (a terminal's Ctrl-C reaches the whole process group, systemd signals the whole
   cgroup: the API process drains first, then stops its workers);
2. loads the enabled plugins, builds the engine with the backend's factory (any backend:
   ``openvino_cpu``, ``cpu``, ``cuda``, ``rocm``, ``ascend``…), starts it and reports
   :class:`~servehall.worker.messages.WorkerReady` (or
   :class:`~servehall.worker.messages.StartFailed` and exits with status 3);
3. serves commands: an engine with a step thread of its own
   (:class:`~servehall.engines.kit.StepSinkEngine`: ``openvino_cpu``, ONNX Runtime)
   sends each step's deltas as one :class:`~servehall.worker.messages.StepOutput` from
   that thread, the moment the step ends — the event loop is not woken, and an engine
   whose ``step()`` keeps the GIL does not make the loop wait for it before a step's
   tokens can leave; for other engines every delta pushed during one event-loop turn
   goes out as one StepOutput from the loop; a heartbeat with ``stats()`` and
   ``health()`` goes out every ``heartbeat_interval_s``. The event loop takes that
   snapshot; a thread of its own sends it (frames from every thread share one socket
   under a lock). A loop starved of
   CPU by the engine's own compute threads (seen: 0.3 s turns with OpenVINO on 2 cores,
   over 1 s under a loaded CI machine) then does not look like a dead worker: the
   heartbeat says the process is alive. A wedged engine is caught by the host's
   stalled-step check (requests in flight, no step output); a wedged loop by the thread
   itself, which stops sending once the snapshot is older than ``loop_timeout_s``.

Input the worker refuses (token ids outside the vocabulary, an engine's ``ValueError``
or ``EngineError`` from ``add_request``) ends that request with ``code =
"invalid_request"`` (a 400 for that request only); nothing a request carries reaches the
engine unchecked.

Test fault hook (honoured only when the environment variable
``SERVEHALL_TEST_WORKER_FAULT`` is set, which only the test-suite does):
``KIND[@GEN[+]]`` applies ``KIND`` to the worker of generation ``GEN`` (1 = the first
worker of a model; ``+`` = that one and every later one; default ``@1``). Kinds:
``hang_step`` — after the first step output the engine's step never returns as far as
the host can see (no more step output; heartbeats go on); ``stall_loop`` — after the
first step output the worker's event loop is blocked once for ``STALL_LOOP_S`` (as a
loop starved of CPU would be; the engine goes on); ``wedge_loop`` — the same, for an
hour; ``exit_after_ready`` — the
worker exits with status 7 right after reporting ready.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from servehall.config.models import ModelConfig
from servehall.engines.child import die_with_parent
from servehall.engines.contract import EmbeddingEngine, Engine, TokenDelta, check_embedding_engine
from servehall.engines.kit import StepSinkEngine
from servehall.worker.messages import DeltaTuple, delta_tuple
from servehall.worker.wire import FrameSender, read_frame

log = logging.getLogger("servehall.worker")

FAULT_ENV = "SERVEHALL_TEST_WORKER_FAULT"
EXIT_START_FAILED = 3
EXIT_FAULT = 7
EXIT_ENGINE_DEAD = 4
STALL_LOOP_S = 1.5


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
    code = asyncio.run(_Worker(spec).run())
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


class _Worker:
    def __init__(self, spec: WorkerSpec) -> None:
        self.spec = spec
        self.commands = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.commands.connect(spec.socket_path)
        reports = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        reports.connect(spec.socket_path)
        self.reports = FrameSender(reports)
        self.engine: Engine | None = None
        self.vocab_size = 0
        self.pending: list[DeltaTuple] = []
        self.flush_scheduled = False
        self.fault = parse_fault(os.environ.get(FAULT_ENV), spec.generation)
        self.hung = False
        self.steps_sent = 0
        self.pumps: set[asyncio.Task[None]] = set()
        self.loop: asyncio.AbstractEventLoop | None = None
        self.beat: Any = None  # the latest Heartbeat snapshot (set on the loop)
        self.beat_at = 0.0  # when it was taken (time.monotonic())
        self.beating = threading.Event()  # set = the heartbeat thread must stop
        # step-thread state of on_step (the stream interval)
        # rid -> [token ids since the last message, finish_reason, error, code]: one list
        # extended per step (no merged delta object per request and step)
        self.held: dict[str, list[Any]] = {}
        self.streaming: set[str] = set()  # requests whose first tokens went out
        self.sent_at = 0.0  # clock() of the last step message from on_step
        self.clock = time.monotonic

    def send(self, message: Any) -> None:
        """Encode and send one report (any thread: the socket is used under a lock).
        The API process closed its end: it is gone or stopping this worker, so exit."""
        try:
            self.reports.send(message)
        except OSError:
            os._exit(1)

    async def run(self) -> int:
        from servehall.worker.messages import StartFailed, WorkerReady

        self.loop = asyncio.get_running_loop()
        try:
            engine = await self._build()
        except BaseException as exc:
            log.error("engine start failed: %s: %s", type(exc).__name__, exc)
            self.send(StartFailed(type(exc).__name__, str(exc) or type(exc).__name__))
            self._close()
            return EXIT_START_FAILED
        self.engine = engine
        if isinstance(engine, StepSinkEngine):
            engine.set_step_sink(self.on_step)  # a step's output leaves from its thread
        info = engine.model_info
        self.vocab_size = info.vocab_size
        self.send(
            WorkerReady(
                pid=os.getpid(),
                backend=engine.backend,
                supported_params=sorted(engine.supported_params),
                max_model_len=info.max_model_len,
                eos_token_ids=list(info.eos_token_ids),
                vocab_size=info.vocab_size,
                extra=_plain(info.extra),
            )
        )
        if self.fault == "exit_after_ready":
            log.error("test fault: exiting after ready")
            self._close()
            return EXIT_FAULT
        await self._snapshot()  # the first heartbeat goes out at once
        snapshots = asyncio.ensure_future(self._snapshots())
        beater = threading.Thread(target=self._beat, name="servehall-heartbeat", daemon=True)
        beater.start()
        try:
            await self._serve()
        finally:
            snapshots.cancel()
            self.beating.set()
            beater.join()
            with contextlib.suppress(BaseException):
                await engine.shutdown()
            self._flush()
            self._close()
        return 0

    async def _build(self) -> Engine:
        from servehall.plugin.manager import PluginHost

        enabled = list(self.spec.plugins)
        if not self.spec.strict_plugins:  # another environment: the plugins it has
            from importlib.metadata import entry_points

            here = {ep.name for ep in entry_points(group="servehall")}
            enabled = [p for p in enabled if p in here]
        plugins = PluginHost(enabled)
        if self.spec.strict_plugins:
            plugins.check_enabled()
        backend = plugins.backends().get(self.spec.backend)
        engine = backend.factory(self.spec.model)
        check_embedding_engine(self.spec.model.name, self.spec.model.task, engine)
        await engine.start()
        return engine

    def _close(self) -> None:
        self.commands.close()
        self.reports.close()

    async def _serve(self) -> None:
        from servehall.worker.messages import (
            AbortRequest,
            AddRequest,
            EmbedRequest,
            StopWorker,
            commands_decoder,
        )

        assert self.engine is not None
        engine = self.engine
        reader, _writer = await asyncio.open_unix_connection(sock=self.commands)
        while True:
            try:
                data = await read_frame(reader)
            except (asyncio.IncompleteReadError, ConnectionError):
                return  # the API process closed its end
            for cmd in commands_decoder.decode(data):
                if isinstance(cmd, AddRequest):
                    self._add(cmd)
                elif isinstance(cmd, AbortRequest):
                    await engine.abort(cmd.request_id)
                elif isinstance(cmd, EmbedRequest):
                    task = asyncio.ensure_future(self._embed(cmd.request_id, cmd.inputs))
                    self.pumps.add(task)
                    task.add_done_callback(self.pumps.discard)
                elif isinstance(cmd, StopWorker):
                    return

    def _add(self, cmd: Any) -> None:
        from servehall.engines.kit import DeltaStream
        from servehall.errors import ServehallError

        assert self.engine is not None
        rid = cmd.request_id
        vocab = self.vocab_size
        if not cmd.prompt or (vocab and any(t < 0 or t >= vocab for t in cmd.prompt)):
            self.on_delta(
                rid,
                TokenDelta(
                    (),
                    "error",
                    error=f"the prompt must be 1 or more token ids in [0, {vocab})",
                    code="invalid_request",
                ),
            )
            return
        try:
            stream = self.engine.add_request(rid, cmd.prompt, cmd.params)
        except (ValueError, ServehallError) as exc:
            msg = getattr(exc, "message", None) or str(exc)
            self.on_delta(rid, TokenDelta((), "error", error=msg, code="invalid_request"))
            return
        if isinstance(stream, DeltaStream):
            stream.listen(self.on_delta)
        else:
            task = asyncio.ensure_future(self._pump(rid, stream))
            self.pumps.add(task)
            task.add_done_callback(self.pumps.discard)

    async def _embed(self, rid: str, inputs: list[list[int]]) -> None:
        """Answer one EmbedRequest with the engine's vectors, or an error."""
        from servehall.errors import EngineUnavailableError, InvalidRequestError
        from servehall.worker.messages import EmbedOutput

        vocab = self.vocab_size
        error: str | None = None
        code: str | None = None
        vectors: list[list[float]] = []
        if not isinstance(self.engine, EmbeddingEngine):
            error, code = "this model's engine cannot embed", "invalid_request"
        elif not inputs or any(
            not x or (vocab and any(t < 0 or t >= vocab for t in x)) for x in inputs
        ):
            error = f"each input must be 1 or more token ids in [0, {vocab})"
            code = "invalid_request"
        else:
            try:
                vectors = await self.engine.embed(inputs)
            except InvalidRequestError as exc:
                error, code = exc.message, "invalid_request"
            except EngineUnavailableError as exc:
                error, code = exc.message, "engine_unavailable"
            except Exception as exc:
                log.exception("embedding %s failed", rid)
                error = f"embedding failed: {type(exc).__name__}"
        self.send(EmbedOutput(rid, vectors, error, code))

    async def _pump(self, rid: str, stream: Any) -> None:
        async for delta in stream:
            self.on_delta(rid, delta)

    def on_delta(self, rid: str, delta: TokenDelta) -> None:
        """Collect a delta; the turn's deltas leave as one StepOutput (loop thread)."""
        if self.hung:
            return
        self.pending.append(delta_tuple(rid, delta))
        if not self.flush_scheduled:
            self.flush_scheduled = True
            assert self.loop is not None
            self.loop.call_soon(self._flush)

    def on_step(self, batch: list[tuple[str, TokenDelta]]) -> None:
        """One engine step's deltas, on the engine's step thread (``set_step_sink``).

        They leave from this thread as one StepOutput, without waking the event loop —
        at once when the step ends a request or brings a request's first tokens, or
        ``stream_interval_s`` has passed since the last message; else they are held
        (merged per request) and leave with a later step's."""
        if self.hung:
            return
        held = self.held
        streaming = self.streaming
        urgent = False
        running: set[str] = set()
        for rid, d in batch:
            entry = held.get(rid)
            if entry is None:
                held[rid] = [list(d.token_ids), d.finish_reason, d.error, d.code]
            else:
                entry[0] += d.token_ids
                entry[1], entry[2], entry[3] = d.finish_reason, d.error, d.code
            if d.finish_reason is not None:
                urgent = True
            else:
                running.add(rid)
                if rid not in streaming:
                    urgent = True
        self.streaming = running  # rids absent from a step (aborted, preempted) drop out
        now = self.clock()
        if not urgent and now - self.sent_at < self.spec.stream_interval_s:
            return
        self.held, self.sent_at = {}, now
        self._ship([(rid, tuple(t), f, e, c) for rid, (t, f, e, c) in held.items()])

    def _flush(self) -> None:
        """Loop thread: the deltas collected by :meth:`on_delta` as one StepOutput."""
        self.flush_scheduled = False
        if not self.pending:
            return
        batch, self.pending = self.pending, []
        self._ship(batch)

    def _ship(self, batch: list[DeltaTuple]) -> None:
        from servehall.worker.messages import StepOutput

        assert self.engine is not None
        try:
            st = self.engine.stats()
            counters = (st.running, st.waiting, st.kv_cache_blocks_used)
        except Exception:
            counters = (0, 0, 0)
        self.send(StepOutput(batch, counters))
        self.steps_sent += 1
        if self.fault == "hang_step" and not self.hung:
            log.error("test fault: the engine step hangs from now on")
            self.hung = True
        elif self.fault in ("stall_loop", "wedge_loop"):
            stall = STALL_LOOP_S if self.fault == "stall_loop" else 3600.0
            self.fault = None
            log.error("test fault: the event loop stalls for %g s", stall)
            assert self.loop is not None
            self.loop.call_soon_threadsafe(time.sleep, stall)  # on the loop, any thread

    async def _snapshots(self) -> None:
        """Every ``heartbeat_interval_s``: a new :meth:`_snapshot`."""
        while True:
            await asyncio.sleep(self.spec.heartbeat_interval_s)
            await self._snapshot()

    async def _snapshot(self) -> None:
        """The engine's ``health()`` and ``stats()`` as the next
        :class:`~servehall.worker.messages.Heartbeat` (sent by :meth:`_beat`)."""
        from servehall.worker.messages import Heartbeat

        assert self.engine is not None
        engine = self.engine
        try:
            health = await engine.health()
            ok, reason = health.ok, health.reason
        except Exception as exc:
            ok, reason = False, f"health check raised {type(exc).__name__}: {exc}"
        if not ok and getattr(engine, "fatal", False):
            # an engine that cannot recover in this process (vLLM whose engine-core
            # process died): its streams have ended with an error; exiting hands the
            # model to the supervisor, which restarts it like any crashed worker
            log.error("engine is dead, exiting for a restart: %s", reason)
            self._flush()
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(EXIT_ENGINE_DEAD)
        try:
            s = engine.stats()
            beat = Heartbeat(
                s.running,
                s.waiting,
                s.kv_cache_blocks_used,
                s.kv_cache_blocks_total,
                s.device_memory_used_bytes,
                s.device_memory_total_bytes,
                ok,
                reason,
                s.prefix_cache_queries,
                s.prefix_cache_hits,
                None
                if s.grammar is None
                else (
                    s.grammar.hits,
                    s.grammar.misses,
                    s.grammar.compile_seconds_sum,
                    s.grammar.compile_buckets,
                ),
                tuple(s.devices),
            )
        except Exception as exc:
            beat = Heartbeat(0, 0, 0, 0, None, None, False, f"stats raised {exc}")
        self.beat, self.beat_at = beat, time.monotonic()

    def _beat(self) -> None:
        """The heartbeat thread: every ``heartbeat_interval_s`` it checks that the API
        process is still its parent (else exits the process) and sends the latest
        snapshot (:meth:`send`) — unless the snapshot is older than
        ``loop_timeout_s``: a wedged event loop must fall silent, not be vouched for.
        Stops when :attr:`beating` is set."""
        while True:
            if os.getppid() != self.spec.parent_pid:
                log.error("the API process is gone; exiting")
                os._exit(1)
            beat, age = self.beat, time.monotonic() - self.beat_at
            if beat is not None and age <= self.spec.loop_timeout_s:
                self.send(beat)
            if self.beating.wait(self.spec.heartbeat_interval_s):
                return


def _plain(extra: dict[str, Any]) -> dict[str, Any]:
    """``ModelInfo.extra`` with values MessagePack can carry (others as ``str``)."""
    out: dict[str, Any] = {}
    for k, v in extra.items():
        out[str(k)] = v if v is None or isinstance(v, bool | int | float | str) else str(v)
    return out
