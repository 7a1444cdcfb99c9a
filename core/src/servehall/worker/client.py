"""The API-process side of an engine worker: :class:`ProcessEngine`, an :class:`Engine`
whose device work runs in a supervised child process (the supervision:
:mod:`servehall.worker.supervisor`).

The request path does not change shape: ``add_request`` returns a
:class:`~servehall.engines.kit.DeltaStream`; the commands of one event-loop turn leave
as one frame (:mod:`servehall.worker.wire`); each
:class:`~servehall.worker.messages.StepOutput` from the worker (one engine step, every
request's new tokens) is delivered to its streams in one go. ``health()`` and
``stats()`` answer from the last heartbeat, without a round trip.
While the worker is down every request ends at once with ``code="engine_unavailable"``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any

from servehall.config.models import ModelConfig
from servehall.config.worker import WorkerSettings
from servehall.engines.contract import (
    EngineHealth,
    EngineStats,
    GrammarStats,
    ModelInfo,
    SamplingParams,
    TokenDelta,
)
from servehall.engines.kit import DeltaStream
from servehall.errors import (
    ConfigError,
    EngineError,
    EngineUnavailableError,
    InvalidRequestError,
)
from servehall.worker.messages import (
    AbortRequest,
    AddRequest,
    EmbedOutput,
    EmbedRequest,
    StepOutput,
    StopWorker,
    WorkerReady,
    command_encoder,
)
from servehall.worker.supervisor import EventFn, StartError, WorkerSupervisor
from servehall.worker.wire import frame

log = logging.getLogger("servehall.worker")


class ProcessEngine(WorkerSupervisor):
    """An engine in a supervised worker process (see the module docstring and
    :class:`~servehall.worker.supervisor.WorkerSupervisor`).

    Args:
        model: the ``[[models]]`` entry (its ``worker`` table tunes supervision unless
            ``settings`` is given).
        backend: the resolved backend name whose factory builds the engine in the worker.
        plugins: entry-point names the worker enables to find that backend.
        settings: supervision settings (default ``model.worker``).
        log_level: the worker's log level.
        probe_prompt: token ids of the one-token probe run after a restart (default
            ``[1]``).
        on_event: ``(action, details)`` for ``restart`` and ``crash_loop``.
        prepare: the backend's :attr:`~servehall.BackendSpec.prepare` (a model
            conversion), run on a thread before the worker is spawned, outside its
            ``start_timeout_s``; the health reason says so meanwhile.
    """

    def __init__(
        self,
        model: ModelConfig,
        backend: str,
        plugins: Sequence[str],
        *,
        settings: WorkerSettings | None = None,
        log_level: str = "info",
        probe_prompt: Sequence[int] | None = None,
        on_event: EventFn | None = None,
        prepare: Callable[[ModelConfig], None] | None = None,
    ) -> None:
        self._prepare = prepare
        super().__init__(
            model, backend, plugins, settings=settings, log_level=log_level, on_event=on_event
        )
        self.probe_prompt = list(probe_prompt or [1])
        self.supported_params: frozenset[str] = frozenset()
        self._info = ModelInfo(max_model_len=1)
        self._streams: dict[str, DeltaStream] = {}
        self._embeds: dict[str, asyncio.Future[list[list[float]]]] = {}
        self._embed_ids = 0
        self._commands: list[Any] = []
        self._flush_scheduled = False
        self._probe_ids = 0

    # --- Engine facts ------------------------------------------------------------------

    @property
    def model_info(self) -> ModelInfo:
        """As reported by the worker's engine."""
        return self._info

    # --- lifecycle ---------------------------------------------------------------------

    async def start(self) -> None:
        """Spawn the worker and wait until its engine started (``start_timeout_s``).

        Raises:
            ConfigError: the worker's backend factory refused the model (bad options,
                not a model directory), with its message.
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
        self._watch = asyncio.ensure_future(self._watch_loop())

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

    async def shutdown(self) -> None:
        """Abort every request, ask the worker to stop (SIGKILL after ``stop_timeout_s``).
        Idempotent."""
        if self._state == "stopped":
            return
        self._state = "stopped"
        self._reason = "engine is shut down"
        self._up.clear()
        for rid in list(self._streams):
            self._abort_now(rid)
        self._fail_embeds()
        for task in (self._watch, self._restart):
            if task is not None:
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task
        gen = self._gen
        if gen is not None and gen.proc is not None and gen.proc.exitcode is None:
            self._send([StopWorker()])
            await self._wait_exit(gen, self.settings.stop_timeout_s)
        await self._teardown_generation(kill=True)
        self._close_contexts()

    # --- requests ----------------------------------------------------------------------

    def add_request(
        self, request_id: str, prompt_token_ids: Sequence[int], params: SamplingParams
    ) -> DeltaStream:
        """Queue a request in the worker (see ``Engine.add_request``).

        While the worker is down the stream ends at once with ``code =
        "engine_unavailable"``.

        Raises:
            ValueError: ``request_id`` is already live.
            EngineError: the engine was shut down or never started.
        """
        if request_id in self._streams:
            raise ValueError(f"request id {request_id!r} is already live")
        if self._state in ("new", "stopped"):
            raise EngineError(f"the engine of model {self.name} is not running")
        stream = DeltaStream(request_id, self._abort_now)
        if self._state != "up":
            stream.push(self._unavailable())
            return stream
        self._submit(stream, prompt_token_ids, params)
        return stream

    def _submit(self, stream: DeltaStream, prompt: Sequence[int], params: SamplingParams) -> None:
        if not self._streams:
            self._last_progress = time.monotonic()  # the stall clock starts now
        self._streams[stream.request_id] = stream
        self._queue_command(AddRequest(stream.request_id, list(prompt), params))

    async def embed(self, inputs: Sequence[Sequence[int]]) -> list[list[float]]:
        """The worker engine's ``embed`` (:class:`~servehall.engines.contract.EmbeddingEngine`)
        over IPC: one :class:`~servehall.worker.messages.EmbedRequest`, one answer.

        Raises:
            EngineUnavailableError: the worker is down or restarting, or went away while
                embedding (503).
            InvalidRequestError: the worker's engine refused the input (or cannot embed).
            EngineError: the worker's engine failed, or the engine was shut down.
        """
        if self._state in ("new", "stopped"):
            raise EngineError(f"the engine of model {self.name} is not running")
        if self._state != "up":
            raise EngineUnavailableError(self._unavailable().error or "engine unavailable")
        return await self._embed_now(inputs)

    async def _embed_now(self, inputs: Sequence[Sequence[int]]) -> list[list[float]]:
        self._embed_ids += 1
        rid = f"embed-{self._embed_ids}"
        assert self._loop is not None
        fut: asyncio.Future[list[list[float]]] = self._loop.create_future()
        if not self._streams and not self._embeds:
            self._last_progress = time.monotonic()  # the stall clock starts now
        self._embeds[rid] = fut
        self._queue_command(EmbedRequest(rid, [list(x) for x in inputs]))
        try:
            return await fut
        finally:
            self._embeds.pop(rid, None)

    def _on_embed(self, msg: EmbedOutput) -> None:
        fut = self._embeds.pop(msg.request_id, None)
        if fut is None or fut.done():
            return
        if msg.error is None:
            fut.set_result(msg.vectors)
        elif msg.code == "invalid_request":
            fut.set_exception(InvalidRequestError(msg.error, param="input"))
        elif msg.code == "engine_unavailable":
            fut.set_exception(EngineUnavailableError(msg.error))
        else:
            fut.set_exception(EngineError(msg.error))

    def _fail_embeds(self) -> None:
        embeds, self._embeds = self._embeds, {}
        failure = self._unavailable().error or "engine unavailable"
        for fut in embeds.values():
            if not fut.done():
                fut.set_exception(EngineUnavailableError(failure))

    async def abort(self, request_id: str) -> None:
        """End the request's stream with ``abort`` now; the worker frees its KV cache."""
        self._abort_now(request_id)

    def _abort_now(self, request_id: str) -> None:
        stream = self._streams.pop(request_id, None)
        if stream is None:
            return
        stream.push(TokenDelta((), "abort"))
        if self._state in ("up", "probing"):
            self._queue_command(AbortRequest(request_id))

    def _queue_command(self, cmd: Any) -> None:
        self._commands.append(cmd)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            assert self._loop is not None
            self._loop.call_soon(self._flush_commands)

    def _flush_commands(self) -> None:
        self._flush_scheduled = False
        cmds, self._commands = self._commands, []
        if cmds and self._state in ("up", "probing"):
            self._send(cmds)

    def _send(self, cmds: list[Any]) -> None:
        # The stream buffers what the socket cannot take at once: the event loop never
        # blocks. Commands are sent only once the worker connected (it is ready); a dead
        # worker's commands are moot: its exit handler ends its streams.
        gen = self._gen
        writer = None if gen is None else gen.commands
        if writer is None or writer.is_closing():
            return
        writer.write(frame(command_encoder.encode(cmds)))

    def _unavailable(self) -> TokenDelta:
        return TokenDelta(
            (),
            "error",
            error=f"The engine of model '{self.name}' is unavailable: {self._reason}",
            code="engine_unavailable",
        )

    # --- health and stats --------------------------------------------------------------

    async def health(self) -> EngineHealth:
        """From the state and the last heartbeat (no round trip to the worker)."""
        if self._state != "up":
            return EngineHealth(False, self._reason)
        hb = self._hb
        if hb is not None and not hb.healthy:
            return EngineHealth(False, hb.reason or "the worker's engine is not healthy")
        return EngineHealth(True)

    def stats(self) -> EngineStats:
        """The last heartbeat's counters, with this side's live-request count."""
        hb = self._hb
        live = len(self._streams)
        if hb is None:
            return EngineStats(0, live, 0, 1)
        if self._state != "up":
            return EngineStats(0, 0, 0, max(hb.kv_cache_blocks_total, 1))
        running = min(self._counters[0], live)
        return EngineStats(
            running=running,
            waiting=max(live - running, 0),
            kv_cache_blocks_used=self._counters[2],
            kv_cache_blocks_total=max(hb.kv_cache_blocks_total, 1),
            device_memory_used_bytes=hb.device_memory_used_bytes,
            device_memory_total_bytes=hb.device_memory_total_bytes,
            prefix_cache_queries=hb.prefix_cache_queries,
            prefix_cache_hits=hb.prefix_cache_hits,
            grammar=None if hb.grammar is None else GrammarStats(*hb.grammar),
            devices=hb.devices,
        )

    # --- what the supervisor asks of the client ------------------------------------------

    def _in_flight(self) -> int:
        return len(self._streams) + len(self._embeds)

    def _on_step(self, msg: StepOutput) -> None:
        streams = self._streams
        for rid, tokens, finish, error, code in msg.deltas:
            stream = streams.get(rid)
            if stream is None:
                continue
            if finish is not None:
                del streams[rid]
            stream.push(TokenDelta(tokens, finish, error, code))  # type: ignore[arg-type]

    def _fail_in_flight(self) -> None:
        streams, self._streams = self._streams, {}
        failure = self._unavailable()
        for stream in streams.values():
            stream.push(failure)
        self._fail_embeds()
        self._commands.clear()

    def _on_ready(self, info: WorkerReady) -> None:
        self._info = ModelInfo(
            max_model_len=info.max_model_len,
            eos_token_ids=tuple(info.eos_token_ids),
            vocab_size=info.vocab_size,
            extra={**info.extra, "isolation": "process", "worker_pid": info.pid},
        )
        self.supported_params = frozenset(info.supported_params)

    async def _probe(self) -> bool:
        """One greedy token through the new worker (an embedding of the probe prompt for
        ``task = "embed"``)."""
        if self.model.task == "embed":
            try:
                async with asyncio.timeout(self.settings.step_timeout_s + 5):
                    await self._embed_now([self.probe_prompt])
            except Exception:
                return False
            return True
        self._probe_ids += 1
        rid = f"servehall-restart-probe-{self._probe_ids}"
        stream = DeltaStream(rid, self._abort_now)
        self._submit(stream, self.probe_prompt, SamplingParams(max_tokens=1, temperature=0.0))
        try:
            async with asyncio.timeout(self.settings.step_timeout_s + 5):
                async for delta in stream:
                    if delta.finish_reason is not None:
                        return delta.finish_reason in ("stop", "length")
        except TimeoutError:
            self._abort_now(rid)
        return False
