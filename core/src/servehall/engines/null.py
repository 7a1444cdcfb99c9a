"""The ``null`` engine: emits tokens at a configured pace without running a model.

For benchmarks and tests only: with it, ``servehall bench`` measures what the platform
(HTTP, scheduling, detokenization, SSE, records) costs per token while the "model"
costs next to nothing. It never loads weights; the model directory is read only for its
``config.json`` facts (vocabulary size, EOS ids, context length) — the host loads the
tokenizer from the same directory, so point ``path`` at the demo model
(``servehall demo-model``) or any Hugging Face model directory.

Pacing (``[[models]] options``, validated by :class:`NullOptions`):

* ``step_time_ms``: wall time of one engine step (0 = steps run back to back, yielding to
  the event loop between steps);
* ``tokens_per_s``: tokens per second per sequence (None = one token per sequence per
  step). With both set, each sequence receives ``tokens_per_s × step_time`` tokens per
  step (fractions carried over); with only ``tokens_per_s``, a step lasts
  ``1 / tokens_per_s`` and carries one token;
* ``max_num_seqs``: sequences in the running batch; later requests wait (FCFS);
* ``test_fail_every``: a test fault (every Nth request fails; :class:`NullOptions`).

Output: the prompt's own token ids repeated (EOS, stop ids and the special tokens of
``tokenizer_config.json`` skipped), so the text is made of the prompt's words and every
request runs to ``max_tokens`` (``finish_reason="length"``). The step loop is an asyncio
task on the host's event loop; its CPU cost is one loop iteration per step plus one
:class:`TokenDelta` per sequence.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from servehall.config.models import ModelConfig
from servehall.config.options import parse_model_options
from servehall.engines.contract import (
    EngineHealth,
    EngineStats,
    ModelInfo,
    SamplingParams,
    TokenDelta,
)
from servehall.engines.kit import DeltaStream, HfModelFacts, read_json_object, stop_token_set
from servehall.errors import ConfigError

BACKEND = "null"


class NullOptions(BaseModel):
    """Options of a model served by the ``null`` backend (see the module docstring).

    Attributes:
        tokens_per_s: tokens per second per sequence (> 0), None = one per step.
        step_time_ms: milliseconds per engine step (>= 0).
        max_num_seqs: most sequences in one step (>= 1).
        test_fail_every: a test fault: every Nth request asking for more than one token
            ends at once with an engine error (readiness probes ask for one and pass),
            e.g. a canary built to fail (docs/versions.md). None: never.
    """

    model_config = ConfigDict(extra="forbid")

    tokens_per_s: float | None = Field(default=None, gt=0)
    step_time_ms: float = Field(default=0.0, ge=0)
    max_num_seqs: int = Field(default=256, ge=1)
    test_fail_every: int | None = Field(default=None, ge=1)

    def pace(self) -> tuple[float, float]:
        """``(step_time_s, tokens_per_step)`` of one sequence."""
        if self.tokens_per_s is None:
            return self.step_time_ms / 1000, 1.0
        if self.step_time_ms == 0:
            return 1 / self.tokens_per_s, 1.0
        step = self.step_time_ms / 1000
        return step, self.tokens_per_s * step


@dataclass(slots=True)
class _Seq:
    stream: DeltaStream
    source: Iterator[int]
    max_tokens: int
    emitted: int = 0
    credit: float = 0.0


def special_token_ids(path: Path) -> frozenset[int]:
    """Ids of the special tokens in ``tokenizer_config.json``'s ``added_tokens_decoder``
    (BOS, chat markers...): the null engine never emits them, so its output is text."""
    cfg = read_json_object(path / "tokenizer_config.json")
    added = cfg.get("added_tokens_decoder")
    if not isinstance(added, dict):
        return frozenset()
    return frozenset(
        int(k)
        for k, v in added.items()
        if str(k).isdigit() and isinstance(v, dict) and v.get("special", False)
    )


def _token_source(prompt: Sequence[int], skip: frozenset[int], vocab: int) -> Iterator[int]:
    """The prompt's ids without ``skip``, cycled; ids from ``[0, vocab)`` when none is left."""
    ids = [t for t in prompt if t not in skip]
    if not ids:
        ids = [t for t in range(max(vocab, 1)) if t not in skip][:64] or [0]
    return itertools.cycle(ids)


class NullEngine:
    """An :class:`~servehall.Engine` that emits the prompt's ids at a configured pace.

    Args:
        model: the ``[[models]]`` entry (``options`` as :class:`NullOptions`).

    Raises:
        ConfigError: invalid options or ``path`` is not a directory.
    """

    backend: str = BACKEND
    supported_params: frozenset[str] = frozenset({"seed", "top_p"})

    def __init__(self, model: ModelConfig) -> None:
        self.name = model.name
        self.options = parse_model_options(
            NullOptions, model.options, model=model.name, what=f"null options of {model.name!r}"
        )
        path = Path(model.path).expanduser()
        if not path.is_dir():
            raise ConfigError(f"model {model.name!r}: {path} is not a directory")
        facts = HfModelFacts.read(path)
        self._special = special_token_ids(path) | set(facts.eos_token_ids)
        native = facts.max_position_embeddings
        self._info = ModelInfo(
            max_model_len=min(model.max_model_len or native, native),
            eos_token_ids=facts.eos_token_ids,
            vocab_size=facts.vocab_size,
            extra={"tokens_per_s": self.options.tokens_per_s, "step_ms": self.options.step_time_ms},
        )
        self._running: dict[str, _Seq] = {}
        self._waiting: dict[str, _Seq] = {}
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._started = False
        self._stopped = False
        self.steps = 0
        self._counted = 0

    @property
    def model_info(self) -> ModelInfo:
        """Context length, EOS ids and vocabulary size from ``config.json``."""
        return self._info

    async def start(self) -> None:
        """Start the step loop (an asyncio task). Idempotent."""
        if self._started:
            return
        self._started = True
        self._task = asyncio.get_running_loop().create_task(self._loop(), name="null-engine")

    def add_request(
        self, request_id: str, prompt_token_ids: Sequence[int], params: SamplingParams
    ) -> AsyncIterator[TokenDelta]:
        """Queue a request (see :meth:`servehall.Engine.add_request`)."""
        if request_id in self._running or request_id in self._waiting:
            raise ValueError(f"request id {request_id!r} is already live")
        stream = DeltaStream(request_id, self._close)
        if not self._started or self._stopped:
            stream.push(TokenDelta((), "error", "the null engine is not running"))
            return stream
        every = self.options.test_fail_every
        if every is not None and params.max_tokens > 1:
            self._counted += 1
            if self._counted % every == 0:
                stream.push(TokenDelta((), "error", "test fault: test_fail_every"))
                return stream
        skip = stop_token_set(params, self._info.eos_token_ids) | self._special
        source = _token_source(prompt_token_ids, frozenset(skip), self._info.vocab_size)
        self._waiting[request_id] = _Seq(stream, source, params.max_tokens)
        self._wake.set()
        return stream

    def _close(self, request_id: str) -> None:
        self._abort_now(request_id)

    def _abort_now(self, request_id: str) -> None:
        seq = self._running.pop(request_id, None) or self._waiting.pop(request_id, None)
        if seq is not None:
            seq.stream.push(TokenDelta((), "abort"))

    async def abort(self, request_id: str) -> None:
        """End a live request with ``abort``; unknown ids are ignored."""
        self._abort_now(request_id)

    async def health(self) -> EngineHealth:
        """OK while started, not shut down, and the step loop is alive."""
        if not self._started:
            return EngineHealth(False, "not started")
        if self._stopped:
            return EngineHealth(False, "shut down")
        if self._task is None or self._task.done():
            return EngineHealth(False, "step loop ended")
        return EngineHealth(True)

    def stats(self) -> EngineStats:
        """Running/waiting counts; one pseudo KV block per running sequence."""
        return EngineStats(
            running=len(self._running),
            waiting=len(self._waiting),
            kv_cache_blocks_used=len(self._running),
            kv_cache_blocks_total=self.options.max_num_seqs,
        )

    async def shutdown(self) -> None:
        """Abort every request and stop the step loop. Idempotent."""
        self._stopped = True
        for rid in [*self._running, *self._waiting]:
            self._abort_now(rid)
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def _admit(self) -> None:
        while self._waiting and len(self._running) < self.options.max_num_seqs:
            rid = next(iter(self._waiting))
            self._running[rid] = self._waiting.pop(rid)

    def _step(self, per_step: float) -> None:
        self.steps += 1
        done: list[str] = []
        for rid, seq in self._running.items():
            seq.credit += per_step
            n = min(int(seq.credit), seq.max_tokens - seq.emitted)
            if n <= 0:
                continue
            seq.credit -= n
            seq.emitted += n
            ids = tuple(next(seq.source) for _ in range(n))
            if seq.emitted >= seq.max_tokens:
                seq.stream.push(TokenDelta(ids, "length"))
                done.append(rid)
            else:
                seq.stream.push(TokenDelta(ids))
        for rid in done:
            del self._running[rid]

    async def _loop(self) -> None:
        step_s, per_step = self.options.pace()
        next_at = time.perf_counter()
        while True:
            self._admit()
            if not self._running:
                self._wake.clear()
                await self._wake.wait()
                next_at = time.perf_counter()
                continue
            self._step(per_step)
            next_at += step_s
            delay = next_at - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            else:
                next_at = time.perf_counter()
                await asyncio.sleep(0)


def null_engine_factory(model: ModelConfig) -> Any:
    """``BackendSpec.factory`` of ``null``: an unstarted :class:`NullEngine`."""
    return NullEngine(model)
