"""Shared parts of the embedding engines (``[[models]] task = "embed"``).

* :class:`EmbedBatcher`: the inputs of every ``embed()`` call that arrives while a
  forward pass runs wait in one queue; the next pass takes them all, on one executor
  thread, and each call gets its own vectors back.
* :func:`padded_passes`: splits a batch of inputs into passes of at most a token budget
  (inputs × longest input, padded).
* :func:`refuse_generation`: the stream an embedding engine answers ``add_request`` with.
* :class:`EmbeddingEngineBase`: what the torch and ``openvino_cpu`` embedding engines
  share (facts read from the model directory, start / embed / health / stats /
  shutdown around one executor thread and an :class:`EmbedBatcher`); each adds its
  loading, its forward pass and its ``model_info``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, ThreadPoolExecutor
from pathlib import Path

from servehall.config.models import ModelConfig
from servehall.engines.contract import EngineHealth, EngineStats, SamplingParams, TokenDelta
from servehall.engines.kit import DeltaStream, HfModelFacts, load_errors
from servehall.engines.pooling import PoolingConfig, read_pooling, refuse_dense
from servehall.errors import EngineError, EngineUnavailableError

Forward = Callable[[list[list[int]]], list[list[float]]]
"""*Executor thread.* Every input's vector, in input order."""


class EmbedBatcher:
    """One queue of ``embed()`` calls, run a batch at a time on ``executor``.

    Args:
        name: the model's name (log lines).
        executor: where ``forward`` runs (the engine's device thread).
        forward: the vectors of a flat list of inputs (see :data:`Forward`).
        log: the engine's logger.
    """

    def __init__(
        self, name: str, executor: Executor, forward: Forward, log: logging.Logger
    ) -> None:
        self.name = name
        self._executor = executor
        self._forward = forward
        self._log = log
        self._queue: list[tuple[list[list[int]], asyncio.Future[list[list[float]]]]] = []
        self._runner: asyncio.Task[None] | None = None
        self._closed = False
        self.running = 0
        """Calls in the forward pass now."""

    @property
    def waiting(self) -> int:
        """Calls queued for the next pass."""
        return len(self._queue)

    async def embed(self, inputs: Sequence[Sequence[int]]) -> list[list[float]]:
        """The vectors of ``inputs`` (one per input), from the next pass.

        Raises:
            EngineUnavailableError: the batcher is closed (before or while waiting).
            EngineError: the forward pass failed (its exception's type and message).
        """
        if self._closed:
            raise EngineUnavailableError(f"the engine of model {self.name!r} is not running")
        if not inputs:
            return []
        fut: asyncio.Future[list[list[float]]] = asyncio.get_running_loop().create_future()
        self._queue.append(([list(x) for x in inputs], fut))
        if self._runner is None or self._runner.done():
            self._runner = asyncio.ensure_future(self._run())
        return await fut

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while self._queue and not self._closed:
            batch, self._queue = self._queue, []
            flat = [ids for inputs, _ in batch for ids in inputs]
            self.running = len(batch)
            try:
                vectors = await loop.run_in_executor(self._executor, self._forward, flat)
            except Exception as exc:
                self._log.exception("embedding engine %s: forward pass failed", self.name)
                for _, fut in batch:
                    if not fut.done():
                        fut.set_exception(
                            EngineError(f"embedding failed: {type(exc).__name__}: {exc}")
                        )
                continue
            finally:
                self.running = 0
            at = 0
            for inputs, fut in batch:
                if not fut.done():
                    fut.set_result(vectors[at : at + len(inputs)])
                at += len(inputs)

    async def close(self) -> None:
        """Fail the queued calls (EngineUnavailableError) and wait for the pass in
        flight. Idempotent."""
        self._closed = True
        queued, self._queue = self._queue, []
        for _, fut in queued:
            if not fut.done():
                fut.set_exception(EngineUnavailableError("the engine is shut down"))
        if self._runner is not None:
            with contextlib.suppress(BaseException):
                await self._runner


def padded_passes(inputs: Sequence[Sequence[int]], budget: int) -> list[tuple[int, int, int]]:
    """Split ``inputs`` (in order) into passes of at most ``budget`` padded tokens
    (inputs in the pass × its longest input); one input longer than the budget is a
    pass of its own.

    Returns:
        ``(start, end, longest)`` per pass: ``inputs[start:end]``, padded to ``longest``.
    """
    out: list[tuple[int, int, int]] = []
    start = 0
    while start < len(inputs):
        end, longest = start, 0
        while end < len(inputs):
            longest_next = max(longest, len(inputs[end]))
            if end > start and longest_next * (end - start + 1) > budget:
                break
            longest, end = longest_next, end + 1
        out.append((start, end, longest))
        start = end
    return out


def refuse_generation(name: str, request_id: str) -> DeltaStream:
    """The stream an embedding engine's ``add_request`` returns: one
    ``finish_reason="error"`` delta, ``code="invalid_request"`` (the model does not
    generate)."""
    stream = DeltaStream(request_id, lambda _rid: None)
    stream.push(
        TokenDelta(
            (),
            "error",
            error=f"model {name!r} is served for embeddings (task 'embed'); "
            "it does not generate text",
            code="invalid_request",
        )
    )
    return stream


class EmbeddingEngineBase:
    """The shared half of an embedding engine (``[[models]] task = "embed"``).

    A subclass sets ``backend``, calls ``__init__`` with what it read, and implements
    :meth:`_new_executor`, :meth:`_load`, :meth:`_forward` and :meth:`_unload` (and
    ``model_info``, from :func:`~servehall.engines.pooling.embedding_facts` plus its own).
    No KV cache: :meth:`stats` reports the calls in the pass as running, the queued ones
    as waiting, 0 of 1 KV blocks.

    Args:
        model: the ``[[models]]`` entry.
        path: the model directory (the sentence-transformers files are read from it).
        facts: its ``config.json`` facts (:class:`~servehall.engines.kit.HfModelFacts`).
        log: the engine's logger.
        load_failure: what a failed load's ``EngineError`` starts with.

    Raises:
        ConfigError: an unreadable or unsupported pooling (:func:`read_pooling`), or a
            model with sentence-transformers ``Dense`` modules (these engines pool the
            transformer's hidden states and do not apply them: its vectors would be
            neither the model's values nor its size), naming ``models.<name>.path``.
    """

    backend: str
    supported_params: frozenset[str] = frozenset()
    batch_tokens: int = 16_384
    """Most padded tokens (inputs × longest input) in one forward pass."""

    def __init__(
        self,
        model: ModelConfig,
        path: Path,
        facts: HfModelFacts,
        log: logging.Logger,
        load_failure: str,
    ) -> None:
        self.name = model.name
        self.path = path
        self.pooling: PoolingConfig = read_pooling(path)
        refuse_dense(self.pooling, model.name, path, f"the {self.backend} embedding engine")
        native = min(facts.max_position_embeddings, self.pooling.max_seq_length or 1 << 30)
        self._max_model_len = min(model.max_model_len or native, native)
        self._vocab_size = facts.vocab_size
        hidden = facts.config.get("hidden_size")
        self._dim = int(hidden) if isinstance(hidden, int) else 0
        pad = facts.config.get("pad_token_id")
        self._pad_id = int(pad) if isinstance(pad, int) else 0
        self._log = log
        self._load_failure = load_failure
        self._executor: ThreadPoolExecutor | None = None
        self._batcher: EmbedBatcher | None = None
        self._started = False
        self._stopped = False

    # --- what a subclass implements -------------------------------------------------

    def _new_executor(self) -> ThreadPoolExecutor:
        """The one-thread executor that loads the model and runs every pass."""
        raise NotImplementedError

    def _load(self) -> None:
        """*Executor thread.* Load the model (may set ``self._dim`` from it)."""
        raise NotImplementedError

    def _forward(self, inputs: list[list[int]], longest: int) -> list[list[float]]:
        """*Executor thread.* One pass over ``inputs`` right-padded to ``longest`` tokens:
        one pooled vector per input."""
        raise NotImplementedError

    def _unload(self) -> None:
        """Drop the model at shutdown, after the last pass (and collect it:
        ``gc.collect()``, before the device memory is given back)."""
        raise NotImplementedError

    # --- the Engine / EmbeddingEngine contract ----------------------------------------

    async def start(self) -> None:
        """Load the model on the executor thread. Idempotent.

        Raises:
            ConfigError: as the subclass's ``_load``; EngineError: any other failure
            (``load_failure``: type and message).
        """
        if self._started:
            return
        self._executor = self._new_executor()
        try:
            with load_errors(self._load_failure, self._log):
                await asyncio.get_running_loop().run_in_executor(self._executor, self._load)
        except BaseException:
            self._executor.shutdown(wait=False)
            self._executor = None
            raise
        self._batcher = EmbedBatcher(self.name, self._executor, self._forward_all, self._log)
        self._started = True

    async def embed(self, inputs: Sequence[Sequence[int]]) -> list[list[float]]:
        """One vector per input (see :meth:`EmbeddingEngine.embed
        <servehall.engines.contract.EmbeddingEngine.embed>`), batched with the other
        calls waiting for the next pass.

        Raises:
            EngineUnavailableError: not started or shut down.
            EngineError: the pass failed.
        """
        if not self._started or self._stopped or self._batcher is None:
            raise EngineUnavailableError(f"the engine of model {self.name!r} is not running")
        return await self._batcher.embed(inputs)

    def _forward_all(self, inputs: list[list[int]]) -> list[list[float]]:
        """*Executor thread.* Every input's vector, in passes of at most
        :attr:`batch_tokens` padded tokens."""
        out: list[list[float]] = []
        for start, end, longest in padded_passes(inputs, self.batch_tokens):
            out.extend(self._forward(inputs[start:end], longest))
        return out

    def add_request(
        self, request_id: str, prompt_token_ids: Sequence[int], params: SamplingParams
    ) -> DeltaStream:
        """Refused: an embedding model does not generate (the stream holds one
        ``finish_reason="error"`` delta, ``code="invalid_request"``)."""
        return refuse_generation(self.name, request_id)

    async def abort(self, request_id: str) -> None:
        """Nothing to abort: :meth:`add_request` never starts a request."""

    async def health(self) -> EngineHealth:
        """``ok`` once loaded, until shutdown."""
        if self._stopped:
            return EngineHealth(False, "engine is shut down")
        if not self._started:
            return EngineHealth(False, "engine is not started")
        return EngineHealth(True)

    def stats(self) -> EngineStats:
        """Embedding calls in the pass (running) and queued (waiting); no KV cache (0 of
        1 blocks)."""
        b = self._batcher
        return EngineStats(b.running if b else 0, b.waiting if b else 0, 0, 1)

    async def shutdown(self) -> None:
        """Fail queued calls, wait for the pass in flight, drop the model. Idempotent."""
        if self._stopped:
            return
        self._stopped = True
        if self._batcher is not None:
            await self._batcher.close()
        if self._executor is not None:
            self._executor.shutdown(wait=False)
        self._unload()
