"""Shared parts of the embedding engines (``[[models]] task = "embed"``).

* :class:`EmbedBatcher`: the inputs of every ``embed()`` call that arrives while a
  forward pass runs wait in one queue; the next pass takes them all, on one executor
  thread, and each call gets its own vectors back.
* :func:`padded_passes`: splits a batch of inputs into passes of at most a token budget
  (inputs × longest input, padded).
* :func:`refuse_generation`: the stream an embedding engine answers ``add_request`` with.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
from concurrent.futures import Executor

from servehall.engines.contract import TokenDelta
from servehall.engines.kit import DeltaStream
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
