"""The ``openvino_cpu`` engine: OpenVINO GenAI's ``ContinuousBatchingPipeline`` behind
:class:`servehall.Engine`.

OpenVINO GenAI schedules requests vLLM-style (paged KV cache in blocks of 32 tokens,
prefill chunks fused with decodes, optional prefix caching). This module drives it, on
the core's step-thread base (:class:`servehall.StepThreadEngine`):

* **one step thread** owns the pipeline: it drains a command queue (add / abort) between
  steps, calls ``pipeline.step()`` (which releases the GIL) while any request is
  unfinished, reads each ``GenerationHandle``'s new token ids and hands them, one batch
  per step, to the asyncio loop with ``loop.call_soon_threadsafe``; so requests join the
  running batch at the next step and the event loop never blocks;
* **shortest prefill first** (``options.shortest_prefill_first``, on by default with
  prefix caching): a new request whose prompt would wait behind longer prompts still in
  prefill goes ahead of them — they are cancelled and re-added after it, and the prefix
  cache gives them back their computed KV blocks;
* **abort** ends the request's stream at once with ``finish_reason="abort"`` and tells the
  step thread to ``cancel()`` the handle and drop it; the pipeline frees the request's KV
  blocks at its next step (queued and running requests alike), which the thread runs at
  once even when nothing else is in flight;
* **stats** come from ``pipeline.get_metrics()`` (scheduled requests, KV-cache usage in %
  of the fixed block pool), combined with the engine's own live-request count;
* **health** fails once the step thread died (a failed ``step()``), and every open stream
  then ends with ``finish_reason="error"``.

Token ids in, token ids out: the host tokenizes and detokenizes with the model's Hugging
Face tokenizer. An end-of-sequence/stop token that ends a request is not emitted (as in
the shared torch engine). ``SamplingParams`` map onto ``openvino_genai.GenerationConfig``:
temperature 0 → greedy; otherwise multinomial with ``temperature``, ``top_p``, ``top_k``,
``rng_seed`` (= ``seed``); in both cases ``presence_penalty`` and ``frequency_penalty``
(OpenVINO subtracts them from the logits of already generated tokens, as OpenAI
describes) and ``repetition_penalty`` (over prompt and generated tokens). ``min_p`` has no
counterpart and is not in :data:`SUPPORTED_PARAMS`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from servehall import (
    ConfigError,
    DeltaStream,
    EngineStats,
    GrammarCache,
    HfModelFacts,
    ModelConfig,
    ModelInfo,
    SamplingParams,
    SpecDecodeStats,
    StepThreadEngine,
    StructuredConstraint,
    TokenDelta,
    compile_then,
    constraint_ebnf,
    load_errors,
    stop_token_set,
)
from servehall_openvino_cpu.convert import resolve_ir_dir
from servehall_openvino_cpu.options import KV_BLOCK_SIZE, plan_num_kv_blocks
from servehall_openvino_cpu.probe import open_model

log = logging.getLogger("servehall.openvino_cpu")

BACKEND = "openvino_cpu"
SUPPORTED_PARAMS: frozenset[str] = frozenset(
    {
        "seed",
        "top_p",
        "presence_penalty",
        "frequency_penalty",
        "top_k",
        "repetition_penalty",
        "structured_output",
        "structural_tag",
    }
)
"""What ``GenerationConfig`` can express. ``min_p`` is not among them (OpenVINO GenAI has no
min-p filter), so the host refuses it with 400 ``unsupported_parameter``."""
GRAMMAR_CACHE_SIZE = 256
"""Compiled constraints kept per model (LRU)."""


@dataclass(slots=True)
class _Live:
    """Step-thread state of one request (``prompt``: the int64 row as added;
    ``started``: a token of it has been read; ``generated``: tokens read so far)."""

    stream: DeltaStream
    handle: Any
    stop_ids: frozenset[int]
    prompt: Any = None
    config: Any = None
    started: bool = False
    generated: int = 0


@dataclass(frozen=True, slots=True)
class _Snapshot:
    """Pipeline counters after the latest step (written by the step thread)."""

    scheduled: int = 0
    in_pipeline: int = 0
    kv_blocks_used: int = 0


class OpenVINOEngine(StepThreadEngine):
    """Continuous-batching engine for one model on the CPU through OpenVINO GenAI.

    Args:
        model: the ``[[models]]`` entry; ``path`` is an OpenVINO IR directory or a Hugging
            Face directory (converted once, see :mod:`servehall_openvino_cpu.convert`);
            ``options`` are validated as :class:`~servehall_openvino_cpu.options.OpenVINOOptions`.

    Raises:
        ConfigError: invalid options, a missing model directory, or bf16 requested on a CPU
            without native bf16 (raised here, before OpenVINO is imported).
    """

    backend: str = BACKEND
    supported_params: frozenset[str] = SUPPORTED_PARAMS

    def __init__(self, model: ModelConfig) -> None:
        super().__init__(model.name, label="openvino_cpu", library="OpenVINO", log=log)
        self.path, self.options, facts = open_model(model)
        if self.options.draft_model is not None:
            _check_draft_vocab(model.name, facts.vocab_size, self.options.draft_model)
        self._hf_config = facts.config
        self._eos_ids = facts.eos_token_ids
        native_len = facts.max_position_embeddings
        self._vocab_size = facts.vocab_size
        wanted_len = min(model.max_model_len or native_len, native_len)
        self._num_blocks = plan_num_kv_blocks(self.options, self._hf_config, wanted_len)
        self._max_model_len = min(wanted_len, self._num_blocks * KV_BLOCK_SIZE)
        self._ir_dir: Path | None = None
        self._draft_ir_dir: Path | None = None
        self._pipe: Any = None
        self._ov_tensor: Any = None
        self._gen_config_cls: Any = None
        self._snapshot = _Snapshot()
        # speculative-decoding counters (step thread writes, stats() reads the reference)
        self._spec: SpecDecodeStats | None = (
            SpecDecodeStats(draft_tokens=0 if self.options.assistant()[0] else None)
            if self.options.draft_model is not None
            else None
        )
        self._next_id = 0
        self._live: dict[int, _Live] = {}  # step thread: pipeline request id -> state
        self._cleanup = False  # step thread: a cancel needs a step to free its KV blocks
        self.grammars: GrammarCache[str] = GrammarCache(constraint_ebnf, GRAMMAR_CACHE_SIZE)
        self._compiler: ThreadPoolExecutor | None = None

    # --- facts -------------------------------------------------------------------------

    @property
    def model_info(self) -> ModelInfo:
        """Context length (capped to the KV pool), EOS ids, vocabulary size, and extras."""
        return ModelInfo(
            max_model_len=self._max_model_len,
            eos_token_ids=self._eos_ids,
            vocab_size=self._vocab_size,
            extra={
                "inference_precision": self.options.inference_precision,
                "kv_cache_precision": self.options.kv_precision() or "openvino-default",
                "kv_cache_blocks": self._num_blocks,
                "kv_block_size": KV_BLOCK_SIZE,
                "prefix_caching": self.options.enable_prefix_caching,
                "ir_dir": str(self._ir_dir) if self._ir_dir else None,
                **self._speculative_info(),
            },
        )

    def _speculative_info(self) -> dict[str, Any]:
        if self.options.draft_model is None:
            return {}
        n, conf = self.options.assistant()
        info: dict[str, Any] = {"draft_model": str(self.options.draft_model)}
        if self._draft_ir_dir is not None:
            info["draft_ir_dir"] = str(self._draft_ir_dir)
        if n is not None:
            info["num_assistant_tokens"] = n
        else:
            info["assistant_confidence_threshold"] = conf
        return info

    # --- lifecycle ---------------------------------------------------------------------

    async def start(self) -> None:
        """Convert if needed, compile the model and start the step thread.

        Raises ConfigError (not a model directory) or EngineError (conversion or
        compilation failed)."""
        if self._started:
            return
        self._loop = self._streams.loop = asyncio.get_running_loop()
        with load_errors(f"openvino_cpu: loading {self.path} failed"):
            await asyncio.to_thread(self._load)
        self._thread = threading.Thread(
            target=self.step_loop, name=f"servehall-ov-{self.name}", daemon=True
        )
        self._started = True
        self._thread.start()

    def _load(self) -> None:
        import openvino as ov
        import openvino_genai as ov_genai

        # xgrammar (and the torch it imports) loads beside the model's compilation, not
        # on the first constrained request: an import that long would stall the worker's
        # heartbeats mid-service
        warm = threading.Thread(target=_import_grammar_backend, daemon=True)
        warm.start()
        self._ir_dir = self._resolve(self.path)
        if self.options.draft_model is not None:
            self._draft_ir_dir = self._resolve(self.options.draft_model)
        self._pipe = self.new_pipeline()
        warm.join()
        self._ov_tensor = ov.Tensor
        self._gen_config_cls = ov_genai.GenerationConfig

    def _resolve(self, path: Path) -> Path:
        """The IR directory of ``path`` (converted once with this model's weight format)."""
        return resolve_ir_dir(
            path,
            cache_dir=self.options.cache_dir,
            weight_format=self.options.weight_format,
            group_size=self.options.weight_group_size,
            ratio=self.options.weight_ratio,
        )

    def new_pipeline(self) -> Any:
        """A ``ContinuousBatchingPipeline`` of the converted model with this engine's
        scheduler config and CPU properties (after :meth:`start`: the IR exists); with a
        ``draft_model``, OpenVINO GenAI's speculative-decoding pipeline (the draft on the
        CPU with the same properties, sharing the scheduler config)."""
        import openvino_genai as ov_genai

        sc = ov_genai.SchedulerConfig()
        sc.num_kv_blocks = self._num_blocks
        sc.max_num_seqs = self.options.max_num_seqs
        sc.max_num_batched_tokens = max(self.options.max_num_batched_tokens, KV_BLOCK_SIZE)
        sc.enable_prefix_caching = self.options.enable_prefix_caching
        sc.dynamic_split_fuse = self.options.dynamic_split_fuse
        props = self.options.ov_properties()
        if self._draft_ir_dir is not None:
            draft = ov_genai.draft_model(str(self._draft_ir_dir), "CPU", **props)
            props = {**props, "draft_model": draft}
        return ov_genai.ContinuousBatchingPipeline(str(self._ir_dir), sc, "CPU", props)

    # --- servehall bench --native ----------------------------------------------------------

    bench_native_name = "OpenVINO GenAI ContinuousBatchingPipeline"

    async def bench_native(
        self,
        prompts: list[list[int]],
        max_tokens: list[int],
        *,
        offsets: list[float] | None,
        max_concurrency: int | None,
        ignore_eos: bool,
        progress: Any,
    ) -> tuple[list[dict[str, Any]], float]:
        """``servehall bench engine --native``: the workload on a second pipeline of the
        same model, driven with OpenVINO GenAI's own API on a thread (see
        :mod:`servehall_openvino_cpu.native_bench`)."""
        from servehall_openvino_cpu.native_bench import run_native

        return await asyncio.to_thread(
            run_native,
            self,
            prompts,
            max_tokens,
            offsets=offsets,
            max_concurrency=max_concurrency,
            ignore_eos=ignore_eos,
            progress=progress,
        )

    def stats(self) -> EngineStats:
        """Running/waiting requests and KV blocks in use (from the last step's metrics)."""
        snap = self._snapshot
        live = len(self._streams)
        running = min(snap.scheduled, live)
        return EngineStats(
            running=running,
            waiting=max(live - running, 0),
            kv_cache_blocks_used=min(snap.kv_blocks_used, self._num_blocks),
            kv_cache_blocks_total=self._num_blocks,
            grammar=self.grammars.stats(),
            spec_decode=self._spec,
        )

    async def shutdown(self) -> None:
        """Abort every request, stop the step thread, release the pipeline. Idempotent."""
        if self._stopped:
            return
        await super().shutdown()
        if self._compiler is not None:
            self._compiler.shutdown(wait=False, cancel_futures=True)
        self._pipe = None

    # --- requests ----------------------------------------------------------------------

    def _add_command(self, stream: DeltaStream, prompt: list[int], params: SamplingParams) -> Any:
        config, stop_ids = self._generation_config(params)  # ValueError/RuntimeError: refused
        return stream, prompt, config, stop_ids

    def _enqueue(self, request_id: str, params: SamplingParams, command: Any) -> None:
        """Queue the ``add`` command; a constrained request's grammar is compiled first
        (:meth:`_compile_then_add`)."""
        if params.structured is None:
            super()._enqueue(request_id, params, command)
        else:
            self._compile_then_add(request_id, params.structured, command)

    def _compile_then_add(
        self, request_id: str, constraint: StructuredConstraint, command: Any
    ) -> None:
        """Compile ``constraint`` (xgrammar 0.1.31, the dialect OpenVINO's bundled parser
        reads; see :func:`servehall.compile_then`), then queue the request with it; a
        constraint that does not compile ends the request with a 400-coded error before it
        reaches a step shared with other requests."""
        if self._compiler is None:
            self._compiler = ThreadPoolExecutor(1, thread_name_prefix="servehall-ov-grammar")
        stream: DeltaStream = command[0]

        def done(ebnf: str | None, error: TokenDelta | None) -> None:
            if stream.done or self._streams.get(request_id) is not stream:
                return  # aborted meanwhile
            if error is not None:
                self._streams.pop(request_id, None)
                stream.push(error)
                return
            import openvino_genai as ov_genai

            soc = ov_genai.StructuredOutputConfig()
            soc.grammar = ebnf
            command[2].structured_output_config = soc
            self._commands.put(("add", command))

        assert self._loop is not None
        compile_then(self.grammars, self._compiler, constraint, self._loop, done)

    def _generation_config(self, p: SamplingParams) -> tuple[Any, frozenset[int]]:
        c = self._gen_config_cls()
        c.max_new_tokens = p.max_tokens
        c.ignore_eos = p.ignore_eos
        stop_ids = stop_token_set(p, self._eos_ids)
        if self._eos_ids and not p.ignore_eos:
            c.eos_token_id = self._eos_ids[0]  # OpenVINO wants it inside stop_token_ids too
        c.stop_token_ids = set(stop_ids)
        if p.temperature <= 0:
            c.do_sample = False
        else:
            c.do_sample = True
            c.temperature = p.temperature
            c.top_p = p.top_p
            if p.top_k > 0:
                c.top_k = p.top_k
            c.rng_seed = p.seed if p.seed is not None else secrets.randbits(31)
        c.presence_penalty = p.presence_penalty
        c.frequency_penalty = p.frequency_penalty
        c.repetition_penalty = p.repetition_penalty
        self.assist(c)
        c.validate()
        return c, stop_ids

    def assist(self, config: Any) -> Any:
        """Set ``num_assistant_tokens`` or ``assistant_confidence_threshold`` on a
        ``GenerationConfig`` when the model has a draft (the speculative pipeline refuses a
        request without one of them); returns ``config``."""
        n, conf = self.options.assistant()
        if n is not None:
            config.num_assistant_tokens = n
        elif conf is not None:
            config.assistant_confidence_threshold = conf
        return config

    # --- step thread -------------------------------------------------------------------

    def _busy(self) -> bool:
        return bool(self._live)

    def _step(self) -> list[tuple[DeltaStream, TokenDelta]]:
        """One ``pipeline.step()`` when requests are live or a cancel needs cleaning up;
        the counters are updated before the deltas are posted (stats never lag a delta)."""
        live = self._live
        cleanup, self._cleanup = self._cleanup, False
        batch: list[tuple[DeltaStream, TokenDelta]] = []
        if live or cleanup:
            self._pipe.step()
            batch = self._collect(live)
        self._update_snapshot(bool(live))
        return batch

    def _close_live(self) -> None:
        live = self._live
        for entry in live.values():
            entry.handle.cancel()
        if live and self._dead_reason is None:
            with contextlib.suppress(Exception):
                self._pipe.step()  # frees the cancelled requests' KV blocks
        live.clear()

    def _admit(self, command: Any) -> None:
        stream, prompt, config, stop_ids = command
        if stream.done:
            return  # aborted before it reached the pipeline
        live = self._live
        row = _int64_row(prompt)
        behind = self._prefills_ahead(live, len(prompt))
        self._pipe_add(live, _Live(stream, None, stop_ids, row, config))
        for rid in behind:  # after it, in their order; their KV blocks stay cached
            entry = live.pop(rid)
            entry.handle.cancel()
            self._cleanup = True
            self._pipe_add(live, entry)

    def _cancel(self, stream: DeltaStream) -> None:
        for rid, entry in list(self._live.items()):
            if entry.stream is stream:
                entry.handle.cancel()
                del self._live[rid]
                self._cleanup = True

    def _pipe_add(self, live: dict[int, _Live], entry: _Live) -> None:
        """Add ``entry``'s prompt to the pipeline under a new id (step thread)."""
        rid = self._next_id
        self._next_id += 1
        entry.handle = self._pipe.add_request(rid, self._ov_tensor(entry.prompt), entry.config)
        live[rid] = entry

    def _prefills_ahead(self, live: dict[int, _Live], prompt_len: int) -> list[int]:
        """The ids of the requests to move behind a new ``prompt_len``-token prompt under
        ``shortest_prefill_first``: those still in prefill (no token read yet) with a longer
        prompt, when the prompts in prefill ahead of it exceed the step's token budget
        (else it is prefilled in the next step anyway). A lower bound on their progress
        is not known here, so their whole prompts are counted."""
        opts = self.options
        if not (opts.shortest_prefill_first and opts.enable_prefix_caching):
            return []
        waiting = [(rid, e.prompt.shape[1]) for rid, e in live.items() if not e.started]
        if sum(n for _, n in waiting) + prompt_len <= opts.max_num_batched_tokens:
            return []
        return [rid for rid, n in waiting if n > prompt_len]

    def _collect(self, live: dict[int, _Live]) -> list[tuple[DeltaStream, TokenDelta]]:
        """New tokens of every live handle since the last read, as deltas to post."""
        batch: list[tuple[DeltaStream, TokenDelta]] = []
        for rid, entry in list(live.items()):
            handle = entry.handle
            tokens: list[int] = []
            finish = "NONE"
            if handle.can_read():
                for out in handle.read().values():
                    tokens.extend(int(t) for t in out.generated_ids)
                    finish = out.finish_reason.name
                if self._spec is not None and entry.started and tokens:
                    left = int(entry.config.max_new_tokens) - entry.generated
                    k = self.options.assistant()[0]
                    self._spec = add_verification_step(self._spec, k, left, len(tokens))
                entry.started = True
                entry.generated += len(tokens)
            status = handle.get_status().name
            if status == "RUNNING" and finish == "NONE":
                if tokens:
                    batch.append((entry.stream, TokenDelta(tuple(tokens))))
                continue
            del live[rid]
            delta: TokenDelta | None
            if status == "IGNORED":
                error = "request does not fit the KV cache"
                delta = TokenDelta(tuple(tokens), "error", error=error)
            elif status in ("CANCEL", "DROPPED_BY_HANDLE", "DROPPED_BY_PIPELINE"):
                delta = None  # aborted: its stream already ended
            elif finish == "STOP":
                if tokens and tokens[-1] in entry.stop_ids:
                    tokens.pop()
                delta = TokenDelta(tuple(tokens), "stop")
            else:
                delta = TokenDelta(tuple(tokens), "length")
            if delta is not None:
                batch.append((entry.stream, delta))
        return batch

    def _update_snapshot(self, busy: bool) -> None:
        if not busy and not self._pipe.has_non_finished_requests():
            self._snapshot = _Snapshot()
            return
        m = self._pipe.get_metrics()
        used = round(float(m.cache_usage) / 100.0 * self._num_blocks)
        self._snapshot = _Snapshot(int(m.scheduled_requests), int(m.requests), used)


def add_verification_step(
    total: SpecDecodeStats, k: int | None, left: int, emitted: int
) -> SpecDecodeStats:
    """``total`` plus one verification step of one request in OpenVINO GenAI's
    speculative pipeline, from what its step API shows: the step ``emitted`` tokens
    (``read()`` after ``step()``), ``left`` tokens were still allowed before it
    (``max_new_tokens`` minus tokens read), ``k`` is ``num_assistant_tokens`` (None under
    ``assistant_confidence_threshold``).

    OpenVINO GenAI reports acceptance only from ``generate()`` (``SDPerModelsPerfMetrics``),
    not per request through ``step()``; so it is derived: the main model appends its own
    token after the accepted prefix of the draft, so ``emitted - 1`` draft tokens were
    accepted (a lower bound: the last step of a request stopped by ``max_tokens`` may
    have had one more accepted and no token of its own); the draft proposed
    ``min(k, left)`` tokens (the draft request has the same ``max_new_tokens``); with a
    confidence threshold the number proposed is not visible (``draft_tokens`` stays None).
    Accepted tokens count at draft positions ``0 .. accepted - 1``.
    """
    accepted = max(emitted - 1, 0)
    proposed = None if k is None or total.draft_tokens is None else min(k, max(left, 0))
    if proposed is not None:
        accepted = min(accepted, proposed)
    per_pos = list(total.accepted_per_position)
    if len(per_pos) < accepted:
        per_pos += [0] * (accepted - len(per_pos))
    for i in range(accepted):
        per_pos[i] += 1
    return SpecDecodeStats(
        drafts=total.drafts + 1,
        draft_tokens=None if proposed is None else (total.draft_tokens or 0) + proposed,
        accepted_tokens=total.accepted_tokens + accepted,
        accepted_per_position=tuple(per_pos),
    )


def _check_draft_vocab(model: str, vocab_size: int, draft: Path) -> None:
    """Refuse a draft model whose vocabulary size differs from the main model's (their
    token ids would not mean the same tokens). Read from ``config.json`` where both say
    it (0: unknown, not checked).

    Raises:
        ConfigError: the sizes differ, or the draft's config.json is not JSON.
    """
    draft_vocab = HfModelFacts.read(draft).vocab_size
    if vocab_size and draft_vocab and draft_vocab != vocab_size:
        raise ConfigError(
            f"models.{model}.options.draft_model: vocabulary size {draft_vocab} differs "
            f"from the model's {vocab_size}; the draft must share the model's tokenizer"
        )


def _import_grammar_backend() -> None:
    with contextlib.suppress(ImportError):
        import xgrammar  # noqa: F401


def _int64_row(prompt: list[int]) -> Any:
    import numpy as np

    return np.asarray([prompt], dtype=np.int64)
