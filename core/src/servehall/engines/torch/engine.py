"""The shared torch engine: transformers' continuous-batching manager plus server glue.

transformers (>= 5.x) ships continuous batching with a paged KV cache:
``model.init_continuous_batching(generation_config, continuous_batching_config)`` returns
a ``ContinuousBatchingManager`` whose background thread schedules requests, runs the
batched forward pass and delivers ``GenerationOutput`` objects (cumulative token lists)
to per-request handlers via ``loop.call_soon_threadsafe``. This module adds what a server
needs around it:

* **streaming onto the asyncio loop** — each request gets a :class:`~servehall.DeltaStream`;
  the manager's handler turns cumulative outputs into ordered :class:`~servehall.TokenDelta`
  values, holding back an end-of-sequence/stop token until the request's final output
  (the manager may append it before the previous callback runs);
* **abort that always ends the stream** — ``manager.cancel_request`` frees the request's
  KV blocks on the next step but emits no terminal output, so :meth:`TorchEngine.abort`
  unregisters the handler and ends the stream itself with ``finish_reason="abort"``;
* **admission by KV reservation** — a request is handed to the manager only when its
  worst-case KV blocks (prompt + ``max_tokens``) fit next to the running ones; otherwise
  it waits, FIFO, in this engine. The manager then never preempts ("soft resets") a
  request: in transformers 5.5 that path shortens streamed requests (the cumulative
  token list is rewritten while the reduced ``max_new_tokens`` limit stays), which we
  measured as 27-43 of 50 requested tokens under KV pressure;
* **KV-cache sizing** from ``kv_cache_blocks`` or a fraction of the device memory free
  after the weights load (:mod:`servehall.engines.torch.kvcache`);
* **stats and health** — running/waiting from the manager's scheduler, KV blocks from its
  ``PagedAttentionCache``, device memory from the :class:`TorchDevice`; a monitor task
  notices a dead step thread and ends every open stream with ``finish_reason="error"``;
* **per-request sampling** (:mod:`servehall.engines.torch.sampling`).

On CPU the manager runs its ``paged|sdpa`` (or ``paged|eager``) attention, implemented in
plain torch (``transformers.integrations.sdpa_paged``); no paged CUDA kernel is needed.
CUDA graphs and async double-buffering are turned off because per-request sampling reads
the synchronous batch I/O on the step thread.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import gc
import logging
import queue
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from servehall.config.models import ModelConfig
from servehall.engines.contract import (
    EngineHealth,
    EngineStats,
    ModelInfo,
    SamplingParams,
    StructuredConstraint,
    TokenDelta,
)
from servehall.engines.kit import DeltaStream, load_errors, stop_token_set
from servehall.engines.torch.device import TorchDevice, open_model
from servehall.engines.torch.kvcache import KvGeometry, plan_kv_blocks
from servehall.engines.torch.options import DTYPE_BYTES, TorchOptions
from servehall.errors import ConfigError, EngineError
from servehall.structured.grammar import (
    GrammarCache,
    GrammarError,
    compile_then,
    constraint_ebnf,
)

log = logging.getLogger("servehall.engines.torch")

MONITOR_INTERVAL_S = 0.2
"""How often the monitor task checks the step thread and drains unrouted outputs."""

SUPPORTED_PARAMS: frozenset[str] = frozenset(
    {
        "seed",
        "top_p",
        "presence_penalty",
        "frequency_penalty",
        "top_k",
        "min_p",
        "repetition_penalty",
        "structured_output",
        "structural_tag",
    }
)
GRAMMAR_CACHE_SIZE = 256
"""Compiled constraints kept per model (LRU)."""


class _RequestStream(DeltaStream):
    """A :class:`~servehall.DeltaStream` plus this engine's per-request state."""

    __slots__ = ("reserved", "sent", "stop_ids", "submitted")

    def __init__(self, engine: TorchEngine, request_id: str, stop_ids: frozenset[int]) -> None:
        super().__init__(request_id, engine._abort_now)
        self.stop_ids = stop_ids
        self.sent = 0
        self.reserved = 0  # KV blocks reserved at admission
        self.submitted = False  # handed to the manager (else waiting in the engine queue)


class TorchEngine:
    """Continuous-batching engine for a Hugging Face causal-LM directory on one torch device.

    Args:
        model: the ``[[models]]`` entry; ``options`` are validated as
            :class:`~servehall.engines.torch.options.TorchOptions`.
        device: the device adapter (``CpuDevice()``, a plugin's CUDA/NPU adapter).
        backend: the backend name reported in ``Engine.backend``.

    Raises:
        ConfigError: invalid options, or options the device cannot honour, or an
            unreadable ``config.json`` (raised here, before any heavy import).
    """

    supported_params: frozenset[str] = SUPPORTED_PARAMS
    #: Seconds without any output while requests are in the manager after which
    #: :meth:`health` reports the step loop as stalled (a hung device or kernel).
    stall_timeout_s: float = 120.0

    def __init__(self, model: ModelConfig, device: TorchDevice, backend: str) -> None:
        self.backend = backend
        self.name = model.name
        self.path = Path(model.path)
        self.device = device
        self.options: TorchOptions
        self.options, facts = open_model(model, device)
        self._hf_config = facts.config
        self._eos_ids = facts.eos_token_ids
        native_len = facts.max_position_embeddings
        self._explicit_len = model.max_model_len is not None
        self._max_model_len = min(model.max_model_len or native_len, native_len)
        self._vocab_size = facts.vocab_size
        self._geometry = KvGeometry.from_hf_config(self._hf_config)
        self._dtype: str | None = None
        self._manager: Any = None
        self._sampler: Any = None
        self._model: Any = None
        self._live: dict[str, _RequestStream] = {}
        self.grammars: GrammarCache[Any] = GrammarCache(self._compile, GRAMMAR_CACHE_SIZE)
        self._compiler: ThreadPoolExecutor | None = None
        self._grammar_compiler: Any = None
        self._pending: collections.deque[tuple[_RequestStream, list[int], SamplingParams]] = (
            collections.deque()
        )
        self._reserved = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._monitor: asyncio.Task[None] | None = None
        self._dead_reason: str | None = None
        self._started = False
        self._stopping = False
        self._stopped = False
        self._num_blocks = 0
        self._prefix_queries = 0  # prompt tokens submitted while prefix sharing is on
        self._failed_status: Any = None
        self._last_progress = time.monotonic()

    # --- facts -------------------------------------------------------------------------

    @property
    def model_info(self) -> ModelInfo:
        """Context length (capped to what the KV cache holds), EOS ids, vocab size."""
        return ModelInfo(
            max_model_len=self._max_model_len,
            eos_token_ids=self._eos_ids,
            vocab_size=self._vocab_size,
            extra={
                "dtype": self._dtype or self.options.dtype,
                "attn_implementation": f"paged|{self.options.attn_implementation}",
                "kv_cache_blocks": self._num_blocks,
                "kv_block_size": self.options.block_size,
                **self.device.describe(self.options),
            },
        )

    # --- lifecycle ---------------------------------------------------------------------

    async def start(self) -> None:
        """Load weights on a worker thread, size the KV cache, start the step thread.

        Raises ConfigError (options the device rejects, KV cache too small) or EngineError
        (weights fail to load, the step thread does not come up)."""
        if self._started:
            return
        self._loop = asyncio.get_running_loop()
        with load_errors(f"model {self.name!r} failed to load on {self.backend}", log):
            await asyncio.to_thread(self._load)
        self._started = True
        self._monitor = asyncio.create_task(self._watch(), name=f"torch-engine-{self.name}")

    def _load(self) -> None:
        import torch
        from transformers import AutoModelForCausalLM, GenerationConfig
        from transformers.generation.configuration_utils import ContinuousBatchingConfig
        from transformers.generation.continuous_batching import RequestStatus

        from servehall.engines.torch.sampling import PerRequestSampler

        with contextlib.suppress(ImportError):  # now, not mid-service (a long import)
            import xgrammar  # noqa: F401

        self._failed_status = RequestStatus.FAILED
        opts = self.options
        self.device.setup(opts)
        self._dtype = self.device.resolve_dtype(opts)
        torch_dtype = getattr(torch, self._dtype)
        model: Any = AutoModelForCausalLM.from_pretrained(
            str(self.path),
            dtype=torch_dtype,
            attn_implementation=opts.attn_implementation,
        )
        model = model.to(self.device.torch_device(opts)).eval()
        self._model = model

        block_bytes = self._geometry.block_bytes(opts.block_size, DTYPE_BYTES[self._dtype])
        explicit_fraction = opts.kv_cache_memory_fraction is not None
        fraction = opts.kv_cache_memory_fraction or self.device.default_kv_fraction
        free = None if opts.kv_cache_blocks is not None else self.device.free_memory_bytes(opts)
        cap = None if explicit_fraction else self.device.max_default_kv_blocks
        blocks = plan_kv_blocks(
            explicit_blocks=opts.kv_cache_blocks,
            fraction=fraction,
            free_bytes=free,
            block_bytes=block_bytes,
            cap=cap,
            min_tokens=2 * opts.block_size,
            block_size=opts.block_size,
        )
        capacity = blocks * opts.block_size - opts.block_size
        if capacity < self._max_model_len:
            if self._explicit_len:
                raise ConfigError(
                    f"model {self.name!r}: KV cache of {blocks} blocks holds {capacity} tokens, "
                    f"less than max_model_len {self._max_model_len}; raise "
                    "options.kv_cache_blocks / kv_cache_memory_fraction or lower max_model_len"
                )
            log.warning(
                "model %s: max_model_len capped from %d to %d tokens (KV cache size)",
                self.name,
                self._max_model_len,
                capacity,
            )
            self._max_model_len = capacity
        self._num_blocks = blocks

        gen_config = GenerationConfig(
            do_sample=False,
            eos_token_id=list(self._eos_ids) or None,
            max_new_tokens=self._max_model_len,
        )
        cb_config = ContinuousBatchingConfig(
            block_size=opts.block_size,
            num_blocks=blocks,
            max_batch_tokens=opts.max_batch_tokens,
            max_memory_percent=1.0,
            allow_block_sharing=opts.prefix_caching,
            use_cuda_graph=False,
            use_async_batching=False,
        )
        # transformers' manager logs every finished request at INFO on its own handler;
        # a server keeps that for debug runs only.
        cb_logger = logging.getLogger("ContinuousBatchingLogger")
        if not log.isEnabledFor(logging.DEBUG) and cb_logger.level == logging.NOTSET:
            cb_logger.setLevel(logging.WARNING)
        manager = model.init_continuous_batching(
            generation_config=gen_config, continuous_batching_config=cb_config
        )
        sampler = PerRequestSampler()
        sampler.bind(manager)
        manager.logit_processor.append(sampler)
        self._sampler = sampler
        step_loop = manager._run_generation_loop
        device = self.device

        def step_loop_on_device() -> None:
            device.thread_setup(opts)  # the current device is per thread (torch.cuda/npu)
            step_loop()

        manager._run_generation_loop = step_loop_on_device
        manager.start()
        deadline = time.monotonic() + 120
        while manager.batch_processor is None:
            if not manager.is_running():
                raise EngineError(
                    f"model {self.name!r}: the continuous-batching thread exited during startup"
                )
            if time.monotonic() > deadline:
                raise EngineError(f"model {self.name!r}: the step thread did not start in 120 s")
            time.sleep(0.01)
        self._manager = manager
        log.info(
            "torch engine %s on %s: dtype=%s attn=paged|%s kv_blocks=%d×%d max_model_len=%d",
            self.name,
            self.device.torch_device(opts),
            self._dtype,
            opts.attn_implementation,
            blocks,
            opts.block_size,
            self._max_model_len,
        )

    async def shutdown(self) -> None:
        """Abort every request (streams end with ``abort``), stop the step thread, free
        the model and cached device memory. Idempotent."""
        if self._stopped:
            return
        self._stopping = True
        for rid in list(self._live):
            self._abort_now(rid)
        if self._monitor is not None:
            self._monitor.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._monitor
        manager, self._manager = self._manager, None
        if manager is not None:
            await asyncio.to_thread(self._stop_manager, manager)
        if self._compiler is not None:
            self._compiler.shutdown(wait=False, cancel_futures=True)
        self._stopped = True

    def _stop_manager(self, manager: Any) -> None:
        manager.stop(block=True, timeout=30)
        if manager.is_running():
            log.warning("torch engine %s: step thread still running after 30 s", self.name)
        self._model = None
        gc.collect()
        with contextlib.suppress(Exception):
            self.device.release(self.options)

    # --- requests ----------------------------------------------------------------------

    def add_request(
        self, request_id: str, prompt_token_ids: Sequence[int], params: SamplingParams
    ) -> _RequestStream:
        """Queue a request; iterate the result for its deltas (see ``Engine.add_request``).

        Admission reserves the request's worst-case KV blocks
        (``ceil((prompt + max_tokens) / block_size)``); a request that does not fit next
        to the running ones waits in this engine's FIFO queue (``stats().waiting``) until
        blocks are released. So the manager never has to preempt ("soft reset") a running
        request — its preemption path cuts streamed requests short in transformers 5.5 —
        and a running request's output never depends on memory pressure.

        Raises ValueError for a duplicate live ``request_id`` or an empty prompt. When the
        engine is not running, or the request alone exceeds the KV cache, the stream holds
        one ``finish_reason="error"`` delta.
        """
        if request_id in self._live:
            raise ValueError(f"request id {request_id!r} is already live")
        if not prompt_token_ids:
            raise ValueError("prompt_token_ids is empty")
        stream = _RequestStream(self, request_id, stop_token_set(params, self._eos_ids))
        reason = self._unavailable_reason()
        if reason is not None or self._manager is None:
            stream.push(TokenDelta((), "error", error=reason or "engine is not running"))
            return stream
        size = self.options.block_size
        stream.reserved = -(-(len(prompt_token_ids) + params.max_tokens) // size)
        if stream.reserved > self._num_blocks:
            stream.push(
                TokenDelta(
                    (),
                    "error",
                    error=f"request needs {stream.reserved} KV-cache blocks; "
                    f"the cache has {self._num_blocks}",
                )
            )
            return stream
        self._live[request_id] = stream
        if params.structured is None:
            self._enqueue(stream, list(prompt_token_ids), params, None)
        else:
            self._compile_then_enqueue(stream, list(prompt_token_ids), params)
        return stream

    def _enqueue(
        self, stream: _RequestStream, prompt: list[int], params: SamplingParams, grammar: Any
    ) -> None:
        self._sampler.add(stream.request_id, params, tuple(prompt), grammar)
        if self._pending or self._reserved + stream.reserved > self._num_blocks:
            self._pending.append((stream, prompt, params))
        else:
            self._submit(stream, prompt, params)

    def _compile_then_enqueue(
        self, stream: _RequestStream, prompt: list[int], params: SamplingParams
    ) -> None:
        """Compile the request's constraint (xgrammar, off the event loop and the step
        thread; cached per model), then queue it; a constraint that does not compile ends
        the request with a 400-coded error before it reaches a step."""
        assert params.structured is not None
        if self._compiler is None:
            self._compiler = ThreadPoolExecutor(1, thread_name_prefix="servehall-torch-grammar")
        rid = stream.request_id

        def done(compiled: Any, error: TokenDelta | None) -> None:
            if stream.done or self._live.get(rid) is not stream:
                return  # aborted meanwhile
            if error is not None:
                self._forget(rid)
                stream.push(error)
                return
            self._enqueue(stream, prompt, params, compiled)

        loop = asyncio.get_running_loop()
        compile_then(self.grammars, self._compiler, params.structured, loop, done)

    def _compile(self, constraint: StructuredConstraint) -> Any:
        """``constraint`` → an xgrammar ``CompiledGrammar`` for this model's vocabulary."""
        import xgrammar as xgr

        if self._grammar_compiler is None:
            from transformers import AutoTokenizer

            tok = AutoTokenizer.from_pretrained(self.path)
            info = xgr.TokenizerInfo.from_huggingface(
                tok, vocab_size=self._vocab_size, stop_token_ids=list(self._eos_ids) or None
            )
            self._grammar_compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
        ebnf = constraint_ebnf(constraint)
        try:
            return self._grammar_compiler.compile_grammar(ebnf)
        except Exception as exc:
            raise GrammarError(str(exc).strip().splitlines()[0]) from None

    def _submit(self, stream: _RequestStream, prompt: list[int], params: SamplingParams) -> None:
        """Hand an admitted request to the manager (its KV blocks are reserved)."""
        manager = self._manager
        rid = stream.request_id
        stream.submitted = True
        if self._reserved == 0:
            self._last_progress = time.monotonic()  # the stall clock starts with work
        self._reserved += stream.reserved
        self._prefix_queries += len(prompt)
        manager.register_result_handler(rid, lambda out, s=stream: self._on_output(s, out))
        try:
            manager.add_request(
                prompt,
                request_id=rid,
                max_new_tokens=params.max_tokens,
                streaming=True,
                eos_token_id=sorted(stream.stop_ids) or [-1],
            )
        except Exception as exc:  # the manager's input queue is full (10 s put timeout)
            self._forget(rid)
            stream.push(TokenDelta((), "error", error=f"engine queue rejected request: {exc}"))

    def _admit_pending(self) -> None:
        """Submit waiting requests, in arrival order, while their KV blocks fit."""
        while self._pending and self._manager is not None and self._dead_reason is None:
            stream, prompt, params = self._pending[0]
            if self._reserved + stream.reserved > self._num_blocks:
                return
            self._pending.popleft()
            self._submit(stream, prompt, params)

    def _on_output(self, stream: _RequestStream, out: Any) -> None:
        """Loop callback for one ``GenerationOutput`` (cumulative ``generated_tokens``)."""
        self._last_progress = time.monotonic()
        if stream.done:
            return
        tokens = out.generated_tokens
        total = len(tokens)
        if out.error is not None or out.status == self._failed_status:
            self._forget(stream.request_id)
            self._note_failure(str(out.error))
            stream.push(
                TokenDelta(tuple(tokens[stream.sent :]), "error", error="engine step failed")
            )
            return
        if out.is_finished():
            self._forget(stream.request_id)
            new = tuple(tokens[stream.sent :])
            if total and tokens[-1] in stream.stop_ids:
                stream.push(TokenDelta(new[:-1], "stop"))
            else:
                stream.push(TokenDelta(new, "length"))
            return
        end = total - 1 if total and tokens[total - 1] in stream.stop_ids else total
        if end > stream.sent:
            stream.push(TokenDelta(tuple(tokens[stream.sent : end])))
            stream.sent = end

    def _forget(self, request_id: str) -> None:
        """Drop a request that ended: handler, sampler state, KV reservation."""
        stream = self._live.pop(request_id, None)
        if self._sampler is not None:
            self._sampler.remove(request_id)
        if stream is None:
            return
        if not stream.submitted:
            self._pending = collections.deque(e for e in self._pending if e[0] is not stream)
            return
        self._reserved -= stream.reserved
        stream.submitted = False
        manager = self._manager
        if manager is not None:
            with manager.output_router._lock:
                manager.output_router.result_handlers.pop(request_id, None)
        if not self._stopping:
            self._admit_pending()

    def _abort_now(self, request_id: str) -> None:
        stream = self._live.get(request_id)
        if stream is None:
            return
        manager = self._manager
        if manager is not None and stream.submitted:
            manager.cancel_request(request_id)
            manager._has_new_requests.set()  # wake an idle step loop so blocks free now
        self._forget(request_id)
        stream.push(TokenDelta((), "abort"))

    async def abort(self, request_id: str) -> None:
        """Cancel a queued or running request; its stream ends with ``finish_reason="abort"``
        at once and its KV blocks are freed at the manager's next step. Unknown ids are
        ignored."""
        self._abort_now(request_id)

    # --- health and stats --------------------------------------------------------------

    def _note_failure(self, error: str) -> None:
        manager = self._manager
        if manager is not None and manager.stop_event.is_set() and not self._stopping:
            self._dead_reason = f"step thread failed: {error}"

    def _unavailable_reason(self, *, stall: bool = False) -> str | None:
        if self._dead_reason is not None:
            return self._dead_reason
        if self._stopped or self._stopping:
            return "engine is shut down"
        if not self._started or self._manager is None:
            return "engine is not started"
        if not self._manager.is_running():
            return "continuous-batching step thread is not running"
        idle = time.monotonic() - self._last_progress
        if stall and self._reserved > 0 and idle > self.stall_timeout_s:
            return f"no engine step finished for {idle:.0f} s with requests in flight (stalled)"
        return None

    async def _watch(self) -> None:
        """Monitor: end open streams with ``error`` when the step thread dies; drain
        outputs that arrive for already-finished/aborted requests."""
        while True:
            await asyncio.sleep(MONITOR_INTERVAL_S)
            manager = self._manager
            if manager is None:
                return
            with contextlib.suppress(queue.Empty):
                while True:
                    manager.output_router.output_queue.get_nowait()
            if not manager.is_running() and not self._stopping:
                self._dead_reason = self._dead_reason or "continuous-batching step thread died"
                log.error("torch engine %s: %s", self.name, self._dead_reason)
                for rid, stream in list(self._live.items()):
                    self._forget(rid)
                    stream.push(TokenDelta((), "error", error="engine stopped"))
                return

    async def health(self) -> EngineHealth:
        """``ok`` while the step thread runs and makes progress; the reason otherwise
        (dead thread, shut down, or stalled longer than ``stall_timeout_s``). Never raises."""
        reason = self._unavailable_reason(stall=True)
        return EngineHealth(ok=reason is None, reason=reason or "")

    def stats(self) -> EngineStats:
        """Running/waiting requests, KV blocks used/total, device memory used/total."""
        used_mem, total_mem = self.device.memory_usage(self.options)
        manager = self._manager
        processor = getattr(manager, "batch_processor", None) if manager is not None else None
        if processor is None:
            return EngineStats(
                0, 0, 0, self._num_blocks, used_mem, total_mem, grammar=self.grammars.stats()
            )
        scheduler = processor.scheduler
        cache = processor.cache
        waiting = len(scheduler.waiting_requests) + manager.input_queue.qsize() + len(self._pending)
        # prefix hits: transformers' PagedAttentionCache counts the prompt tokens it found
        # in shared blocks (``_total_prefix_length``); queries are the prompt tokens we
        # submitted. None when prefix sharing is off (or the model cannot share).
        hits = getattr(cache, "_total_prefix_length", None)
        sharing = bool(getattr(cache, "use_prefix_sharing", False)) and hits is not None
        return EngineStats(
            running=len(scheduler.active_requests),
            waiting=waiting,
            kv_cache_blocks_used=cache.num_blocks - cache.get_num_free_blocks(),
            kv_cache_blocks_total=cache.num_blocks,
            device_memory_used_bytes=used_mem,
            device_memory_total_bytes=total_mem,
            prefix_cache_queries=self._prefix_queries if sharing else None,
            prefix_cache_hits=int(hits) if sharing and hits is not None else None,
            grammar=self.grammars.stats(),
        )
