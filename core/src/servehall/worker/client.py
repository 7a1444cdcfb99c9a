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
import collections
import logging
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
    SpecDecodeStats,
    TokenDelta,
)
from servehall.engines.kit import DeltaStream
from servehall.errors import EngineError, EngineUnavailableError, InvalidRequestError
from servehall.worker.messages import (
    AbortRequest,
    AddRequest,
    EmbedOutput,
    EmbedRequest,
    StepOutput,
    WorkerReady,
)
from servehall.worker.supervisor import EventFn, WorkerSupervisor

log = logging.getLogger("servehall.worker")


class ProcessEngine:
    """An engine in a supervised worker process (see the module docstring).

    It holds its :attr:`supervisor` (:class:`~servehall.worker.supervisor.WorkerSupervisor`:
    spawning, watching, restarting) and is that supervisor's
    :class:`~servehall.worker.supervisor.WorkerClient`; the supervision facts hosts and
    metrics read (:attr:`worker_up`, :attr:`restart_counts`, …) are the supervisor's.

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
        self.supervisor = WorkerSupervisor(
            model,
            backend,
            plugins,
            self,
            settings=settings,
            log_level=log_level,
            on_event=on_event,
            prepare=prepare,
        )
        self.name = model.name
        self.model = model
        self.backend = backend
        self.settings = self.supervisor.settings
        self.probe_prompt = list(probe_prompt or [1])
        self.supported_params: frozenset[str] = frozenset()
        self._info = ModelInfo(max_model_len=1)
        self._streams: dict[str, DeltaStream] = {}
        self._embeds: dict[str, asyncio.Future[list[list[float]]]] = {}
        self._embed_ids = 0
        self._commands: list[Any] = []
        self._flush_scheduled = False
        self._probe_ids = 0
        self._loop: asyncio.AbstractEventLoop | None = None

    # --- supervision facts (the supervisor's) ------------------------------------------

    @property
    def worker_up(self) -> bool:
        """The worker runs and serves requests (``servehall_engine_up``)."""
        return self.supervisor.worker_up

    @property
    def worker_pid(self) -> int | None:
        """The current worker's pid (None when none runs)."""
        return self.supervisor.worker_pid

    @property
    def crash_looping(self) -> bool:
        """The supervisor gave up restarting (``servehall_engine_crash_loop``)."""
        return self.supervisor.crash_looping

    @property
    def state_reason(self) -> str:
        """Why the engine is not up ("" when it is)."""
        return self.supervisor.state_reason

    async def wait_up(self, timeout: float) -> bool:
        """Wait up to ``timeout`` s for the engine to be up (see
        :meth:`~servehall.worker.supervisor.WorkerSupervisor.wait_up`)."""
        return await self.supervisor.wait_up(timeout)

    @property
    def restart_counts(self) -> collections.Counter[str]:
        """Restarts by reason (``servehall_engine_restarts_total``)."""
        return self.supervisor.restart_counts

    @property
    def started_at(self) -> float:
        """Unix time the current worker came up (0 before any)."""
        return self.supervisor.started_at

    @property
    def last_exit_reason(self) -> str:
        """The kind of the last loss, "" before any."""
        return self.supervisor.last_exit_reason

    @property
    def oom_kills(self) -> int:
        """Workers killed by the OOM killer (``servehall_engine_oom_kills_total``)."""
        return self.supervisor.oom_kills

    @property
    def busy_silences(self) -> int:
        """Heartbeat silences forgiven because the worker was busy."""
        return self.supervisor.busy_silences

    # --- Engine facts ------------------------------------------------------------------

    @property
    def model_info(self) -> ModelInfo:
        """As reported by the worker's engine."""
        return self._info

    # --- lifecycle ---------------------------------------------------------------------

    async def start(self) -> None:
        """Spawn the worker and wait until its engine started (``start_timeout_s``;
        :meth:`~servehall.worker.supervisor.WorkerSupervisor.start`).

        Raises:
            ConfigError: the worker's backend factory refused the model (bad options,
                not a model directory), with its message.
            EngineError: the worker failed or died while starting (message with its exit
                reason and last stderr lines), or did not start in time.
        """
        self._loop = asyncio.get_running_loop()
        await self.supervisor.start()

    async def shutdown(self) -> None:
        """Abort every request, ask the worker to stop (SIGKILL after ``stop_timeout_s``).
        Idempotent."""
        await self.supervisor.stop()

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
        state = self.supervisor.state
        if state in ("new", "stopped"):
            raise EngineError(f"the engine of model {self.name} is not running")
        stream = DeltaStream(request_id, self._abort_now)
        if state != "up":
            stream.push(self._unavailable())
            return stream
        self._submit(stream, prompt_token_ids, params)
        return stream

    def _submit(self, stream: DeltaStream, prompt: Sequence[int], params: SamplingParams) -> None:
        if not self._streams:
            self.supervisor.start_stall_clock()
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
        state = self.supervisor.state
        if state in ("new", "stopped"):
            raise EngineError(f"the engine of model {self.name} is not running")
        if state != "up":
            raise EngineUnavailableError(self._unavailable().error or "engine unavailable")
        return await self._embed_now(inputs)

    async def _embed_now(self, inputs: Sequence[Sequence[int]]) -> list[list[float]]:
        self._embed_ids += 1
        rid = f"embed-{self._embed_ids}"
        assert self._loop is not None
        fut: asyncio.Future[list[list[float]]] = self._loop.create_future()
        if not self._streams and not self._embeds:
            self.supervisor.start_stall_clock()
        self._embeds[rid] = fut
        self._queue_command(EmbedRequest(rid, [list(x) for x in inputs]))
        try:
            return await fut
        finally:
            self._embeds.pop(rid, None)

    def on_embed(self, msg: EmbedOutput) -> None:
        """Deliver one embedding answer to its caller (the supervisor's
        :class:`~servehall.worker.supervisor.WorkerClient`)."""
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
        if self.supervisor.state in ("up", "probing"):
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
        if cmds and self.supervisor.state in ("up", "probing"):
            self.supervisor.send(cmds)

    def _unavailable(self) -> TokenDelta:
        return TokenDelta(
            (),
            "error",
            error=f"The engine of model '{self.name}' is unavailable: "
            f"{self.supervisor.state_reason}",
            code="engine_unavailable",
        )

    # --- health and stats --------------------------------------------------------------

    async def health(self) -> EngineHealth:
        """From the state and the last heartbeat (no round trip to the worker)."""
        sup = self.supervisor
        if sup.state != "up":
            return EngineHealth(False, sup.state_reason)
        hb = sup.heartbeat
        if hb is not None and not hb.healthy:
            return EngineHealth(False, hb.reason or "the worker's engine is not healthy")
        return EngineHealth(True)

    def stats(self) -> EngineStats:
        """The last heartbeat's counters, with this side's live-request count."""
        sup = self.supervisor
        hb = sup.heartbeat
        live = len(self._streams)
        if hb is None:
            return EngineStats(0, live, 0, 1)
        if sup.state != "up":
            return EngineStats(0, 0, 0, max(hb.kv_cache_blocks_total, 1))
        counters = sup.counters
        running = min(counters[0], live)
        return EngineStats(
            running=running,
            waiting=max(live - running, 0),
            kv_cache_blocks_used=counters[2],
            kv_cache_blocks_total=max(hb.kv_cache_blocks_total, 1),
            device_memory_used_bytes=hb.device_memory_used_bytes,
            device_memory_total_bytes=hb.device_memory_total_bytes,
            prefix_cache_queries=hb.prefix_cache_queries,
            prefix_cache_hits=hb.prefix_cache_hits,
            grammar=None if hb.grammar is None else GrammarStats(*hb.grammar),
            devices=hb.devices,
            spec_decode=None if hb.spec_decode is None else SpecDecodeStats(*hb.spec_decode),
        )

    # --- what the supervisor asks of the client (WorkerClient) -------------------------

    def in_flight(self) -> int:
        """Requests and embeddings in flight."""
        return len(self._streams) + len(self._embeds)

    def on_step(self, msg: StepOutput) -> None:
        """Deliver one engine step's deltas to their streams."""
        streams = self._streams
        for rid, tokens, finish, error, code in msg.deltas:
            stream = streams.get(rid)
            if stream is None:
                continue
            if finish is not None:
                del streams[rid]
            stream.push(TokenDelta(tokens, finish, error, code))  # type: ignore[arg-type]

    def fail_in_flight(self) -> None:
        """End every in-flight request with ``engine_unavailable``; drop queued
        commands."""
        streams, self._streams = self._streams, {}
        failure = self._unavailable()
        for stream in streams.values():
            stream.push(failure)
        self._fail_embeds()
        self._commands.clear()

    def abort_all(self) -> None:
        """End every request with ``abort`` and every embedding as unavailable (the
        engine is shutting down)."""
        for rid in list(self._streams):
            self._abort_now(rid)
        self._fail_embeds()

    def on_ready(self, info: WorkerReady) -> None:
        """Take the new worker's engine facts."""
        self._info = ModelInfo(
            max_model_len=info.max_model_len,
            eos_token_ids=tuple(info.eos_token_ids),
            vocab_size=info.vocab_size,
            extra={**info.extra, "isolation": "process", "worker_pid": info.pid},
        )
        self.supported_params = frozenset(info.supported_params)

    async def probe(self) -> bool:
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
