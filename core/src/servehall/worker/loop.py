"""The engine worker process's serve loop (child side; started by
:func:`~servehall.worker.bootstrap.worker_main`; the transport:
:mod:`servehall.worker.wire`).

:class:`WorkerLoop` builds one model's engine and drives it over two Unix sockets:

1. it loads the enabled plugins, builds the engine with the backend's factory (any
   backend: ``openvino_cpu``, ``cpu``, ``cuda``, ``rocm``, ``ascend``…), starts it and
   reports :class:`~servehall.worker.messages.WorkerReady` (or
   :class:`~servehall.worker.messages.StartFailed` and ends with
   :data:`EXIT_START_FAILED`);
2. it serves commands: an engine with a step thread of its own
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

The test fault hook (:mod:`servehall.worker.faults`) is asked after the ready report and
after each step output sent; it does nothing unless the test-suite set it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import sys
import threading
import time
from typing import TYPE_CHECKING, Any

from servehall.engines.contract import EmbeddingEngine, Engine, TokenDelta, check_embedding_engine
from servehall.engines.kit import StepSinkEngine
from servehall.worker.faults import EXIT_FAULT, FaultHook
from servehall.worker.messages import DeltaTuple, delta_tuple
from servehall.worker.wire import FrameSender, read_frame

if TYPE_CHECKING:
    from servehall.worker.bootstrap import WorkerSpec

log = logging.getLogger("servehall.worker")

EXIT_START_FAILED = 3
EXIT_ENGINE_DEAD = 4


class WorkerLoop:
    """The serve/step loop of one worker process (see the module docstring).

    Connects to ``spec.socket_path`` twice at once (commands, then reports); :meth:`run`
    builds the engine and serves until the API process closes its end or sends
    ``StopWorker``, and returns the process's exit status.
    """

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
        self.faults = FaultHook.from_env(spec.generation)
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
        if self.faults.exit_after_ready():
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
        if self.faults.hung:
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
        if self.faults.hung:
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
        self.faults.after_step(self.loop)

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
                None
                if s.spec_decode is None
                else (
                    s.spec_decode.drafts,
                    s.spec_decode.draft_tokens,
                    s.spec_decode.accepted_tokens,
                    tuple(s.spec_decode.accepted_per_position),
                ),
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
