"""The ``openvino_cpu`` engine for ``[[models]] task = "embed"`` (``/v1/embeddings``).

The model is an encoder (BERT and the like): a Hugging Face directory is exported once
with optimum-intel's ``feature-extraction`` task (:mod:`servehall_openvino_cpu.convert`,
cached like a language model), an OpenVINO IR directory is used as it is. The IR is
compiled for the CPU with ``openvino.Core().compile_model`` and run on token ids; its
``last_hidden_state`` is pooled by the core's shared pooling
(:func:`servehall.read_pooling` reads the model's sentence-transformers ``modules.json`` /
``1_Pooling`` config; :func:`servehall.pool_numpy` applies mean / CLS / max / ... over the
attention mask and the L2 normalisation of a ``Normalize`` module), as the torch engine
does.

Why not ``openvino_genai.TextEmbeddingPipeline``: it takes strings only
(``embed_documents(list[str])``, tokenized by its own ``openvino_tokenizer.xml``), while
:meth:`EmbeddingEngine.embed <servehall.EmbeddingEngine.embed>` takes token ids (the API
tokenizes, counts usage and checks lengths with the model's Hugging Face tokenizer, and
accepts token arrays from clients). Detokenizing and letting the pipeline tokenize again
would not give back the same ids in general (unknown tokens, an uncased vocabulary,
client-chosen arrays), so the engine runs the same IR on the ids it was given. Its
vectors equal the pipeline's for text both tokenize alike (``tests/test_ov_embedding.py``
checks it), and the pipeline's pooling choices (``CLS`` / ``MEAN`` / ``LAST_TOKEN``,
``normalize``) are a subset of the shared pooling's.

Batching: every :meth:`OpenVINOEmbeddingEngine.embed` call that arrives while an
inference runs waits for the next one, which takes them all (:class:`servehall.EmbedBatcher`),
padded to the longest input and split into inferences of at most :data:`BATCH_TOKENS`
padded tokens, on one inference thread. No KV cache: ``stats()`` reports the calls in the
inference as running, the queued ones as waiting, 0 of 1 KV blocks.
"""

from __future__ import annotations

import asyncio
import gc
import logging
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from servehall import (
    ConfigError,
    DeltaStream,
    EmbedBatcher,
    EngineError,
    EngineHealth,
    EngineStats,
    EngineUnavailableError,
    HfModelFacts,
    ModelConfig,
    ModelInfo,
    PoolingConfig,
    SamplingParams,
    padded_passes,
    pool_numpy,
    read_pooling,
    refuse_generation,
)
from servehall_openvino_cpu.convert import EMBED_TASK, resolve_ir_dir
from servehall_openvino_cpu.options import OpenVINOOptions, parse_options
from servehall_openvino_cpu.probe import bf16_native

log = logging.getLogger("servehall.openvino_cpu")

BACKEND = "openvino_cpu"
BATCH_TOKENS = 16_384
"""Most padded tokens (inputs × longest input) in one inference."""
INPUTS = ("input_ids", "attention_mask", "token_type_ids", "position_ids")
"""The IR inputs this engine fills (``token_type_ids`` zeros, ``position_ids`` 0..n-1)."""


def check_embed_options(opts: OpenVINOOptions, model: str) -> None:
    """Refuse options that make no sense for an embedding model (``draft_model``).

    Raises:
        ConfigError: naming ``models.<model>.options.draft_model``.
    """
    if opts.draft_model is not None:
        key = f"models.{model}.options.draft_model"
        msg = "speculative decoding is for task 'generate'; an embedding model has no draft"
        raise ConfigError(f"{key}: {msg}", [(key, msg)])


class OpenVINOEmbeddingEngine:
    """An embedding model on the CPU through OpenVINO.

    Args:
        model: the ``[[models]]`` entry (``task = "embed"``); ``path`` is a Hugging Face
            encoder directory (converted once) or an OpenVINO IR directory of one (then
            pooled by its ``modules.json`` if it has one, else mean + L2 normalisation).
            Of the options, ``inference_precision`` (``dtype``), ``inference_num_threads``,
            ``weight_format`` (+ ``weight_group_size`` / ``weight_ratio``) and
            ``cache_dir`` apply; the KV-cache and scheduler options are unused.

    Raises:
        ConfigError: invalid options, ``draft_model``, a missing directory, bf16 on a CPU
            without native bf16, an unsupported pooling.
    """

    backend: str = BACKEND
    supported_params: frozenset[str] = frozenset()

    def __init__(self, model: ModelConfig) -> None:
        self.name = model.name
        self.path = Path(model.path).expanduser()
        self.options = parse_options(model.options, model=model.name)
        check_embed_options(self.options, model.name)
        if self.options.inference_precision == "bf16" and not bf16_native():
            raise ConfigError(
                f"model {model.name!r}: inference_precision 'bf16' needs a CPU with "
                "AVX-512 BF16 or AMX (not found in /proc/cpuinfo); use 'f32'"
            )
        if not self.path.is_dir():
            raise ConfigError(f"model {model.name!r}: {self.path} is not a directory")
        facts = HfModelFacts.read(self.path)
        self.pooling: PoolingConfig = read_pooling(self.path)
        native = min(facts.max_position_embeddings, self.pooling.max_seq_length or 1 << 30)
        self._max_model_len = min(model.max_model_len or native, native)
        self._vocab_size = facts.vocab_size
        hidden = facts.config.get("hidden_size")
        self._dim = int(hidden) if isinstance(hidden, int) else 0
        pad = facts.config.get("pad_token_id")
        self._pad_id = int(pad) if isinstance(pad, int) else 0
        self._ir_dir: Path | None = None
        self._request: Any = None  # openvino.InferRequest (inference thread only)
        self._inputs: tuple[str, ...] = ()
        self._executor: ThreadPoolExecutor | None = None
        self._batcher: EmbedBatcher | None = None
        self._started = False
        self._stopped = False

    @property
    def model_info(self) -> ModelInfo:
        """Input length limit, vocabulary, and in ``extra``: ``task``, ``embedding_dim``,
        ``pooling``, ``normalize``, ``matryoshka``, ``matryoshka_dimensions``,
        ``inference_precision``, ``weight_format``, ``ir_dir``."""
        return ModelInfo(
            max_model_len=self._max_model_len,
            vocab_size=self._vocab_size,
            extra={
                "task": "embed",
                "embedding_dim": self._dim,
                "pooling": self.pooling.mode,
                "normalize": self.pooling.normalize,
                "matryoshka": self.pooling.matryoshka,
                "matryoshka_dimensions": list(self.pooling.matryoshka_dimensions),
                "inference_precision": self.options.inference_precision,
                "weight_format": self.options.weight_format,
                "ir_dir": str(self._ir_dir) if self._ir_dir else None,
            },
        )

    def resolve(self) -> Path:
        """The IR directory of the model (converted once with ``feature-extraction``).

        Raises:
            ConfigError / EngineError: as :func:`~servehall_openvino_cpu.convert.resolve_ir_dir`.
        """
        return resolve_ir_dir(
            self.path,
            cache_dir=self.options.cache_dir,
            weight_format=self.options.weight_format,
            group_size=self.options.weight_group_size,
            ratio=self.options.weight_ratio,
            task=EMBED_TASK,
        )

    async def start(self) -> None:
        """Convert if needed and compile the IR for the CPU, on the inference thread.

        Raises:
            ConfigError: not a model directory; EngineError: conversion or compilation
            failed, or the IR is not an encoder this engine can feed.
        """
        if self._started:
            return
        self._executor = ThreadPoolExecutor(1, thread_name_prefix=f"ov-embed-{self.name}")
        try:
            await asyncio.get_running_loop().run_in_executor(self._executor, self._load)
        except (ConfigError, EngineError):
            raise
        except Exception as exc:
            log.exception("openvino_cpu embedding engine for %s failed to start", self.name)
            raise EngineError(
                f"openvino_cpu: loading {self.path} failed: {type(exc).__name__}: {exc}"
            ) from exc
        self._batcher = EmbedBatcher(self.name, self._executor, self._forward_all, log)
        self._started = True

    def _load(self) -> None:
        import openvino as ov

        self._ir_dir = self.resolve()
        model = ov.Core().read_model(str(self._ir_dir / "openvino_model.xml"))
        names = tuple(n for i in model.inputs for n in i.get_names() if n in INPUTS)
        missing = [i.get_any_name() for i in model.inputs if not set(i.get_names()) & set(INPUTS)]
        if "input_ids" not in names or missing:
            raise EngineError(
                f"openvino_cpu: {self._ir_dir} is not an encoder this engine can feed "
                f"(inputs {[i.get_any_name() for i in model.inputs]}; it fills {list(INPUTS)})"
            )
        dim = model.outputs[0].get_partial_shape()[-1]
        if dim.is_static:
            self._dim = dim.get_length()
        props: dict[str, Any] = {"INFERENCE_PRECISION_HINT": self.options.inference_precision}
        if self.options.inference_num_threads is not None:
            props["INFERENCE_NUM_THREADS"] = self.options.inference_num_threads
        compiled = ov.Core().compile_model(model, "CPU", props)
        self._inputs = names
        self._request = compiled.create_infer_request()
        log.info(
            "openvino_cpu embedding engine %s: precision=%s pooling=%s normalize=%s dim=%d "
            "max_model_len=%d ir=%s",
            self.name,
            self.options.inference_precision,
            self.pooling.mode,
            self.pooling.normalize,
            self._dim,
            self._max_model_len,
            self._ir_dir,
        )

    async def embed(self, inputs: Sequence[Sequence[int]]) -> list[list[float]]:
        """One vector per input (see :meth:`servehall.EmbeddingEngine.embed`), batched
        with the other calls waiting for the next inference.

        Raises:
            EngineUnavailableError: not started or shut down.
            EngineError: the inference failed.
        """
        if not self._started or self._stopped or self._batcher is None:
            raise EngineUnavailableError(f"the engine of model {self.name!r} is not running")
        return await self._batcher.embed(inputs)

    def _forward_all(self, inputs: list[list[int]]) -> list[list[float]]:
        """*Inference thread.* Every input's vector, in inferences of at most
        :data:`BATCH_TOKENS` padded tokens."""
        out: list[list[float]] = []
        for start, end, longest in padded_passes(inputs, BATCH_TOKENS):
            out.extend(self._forward(inputs[start:end], longest))
        return out

    def _forward(self, inputs: list[list[int]], longest: int) -> list[list[float]]:
        """*Inference thread.* One inference over ``inputs`` right-padded to ``longest``."""
        import numpy as np

        ids = np.full((len(inputs), longest), self._pad_id, dtype=np.int64)
        mask = np.zeros((len(inputs), longest), dtype=np.int64)
        for i, row in enumerate(inputs):
            ids[i, : len(row)] = row
            mask[i, : len(row)] = 1
        feed = {
            "input_ids": ids,
            "attention_mask": mask,
            "token_type_ids": np.zeros_like(ids),
            "position_ids": np.broadcast_to(np.arange(longest, dtype=np.int64), ids.shape),
        }
        result = self._request.infer({n: feed[n] for n in self._inputs})
        hidden = result[self._request.model_outputs[0]]
        vectors: list[list[float]] = pool_numpy(hidden, mask, self.pooling).tolist()
        return vectors

    def add_request(
        self, request_id: str, prompt_token_ids: Sequence[int], params: SamplingParams
    ) -> DeltaStream:
        """Refused: an embedding model does not generate (one ``finish_reason="error"``
        delta, ``code="invalid_request"``)."""
        return refuse_generation(self.name, request_id)

    async def abort(self, request_id: str) -> None:
        """Nothing to abort: :meth:`add_request` never starts a request."""

    async def health(self) -> EngineHealth:
        """``ok`` once compiled, until shutdown."""
        if self._stopped:
            return EngineHealth(False, "engine is shut down")
        if not self._started:
            return EngineHealth(False, "engine is not started")
        return EngineHealth(True)

    def stats(self) -> EngineStats:
        """Embedding calls in the inference (running) and queued (waiting); no KV cache
        (0 of 1 blocks)."""
        b = self._batcher
        return EngineStats(b.running if b else 0, b.waiting if b else 0, 0, 1)

    async def shutdown(self) -> None:
        """Fail queued calls, release the compiled model. Idempotent."""
        if self._stopped:
            return
        self._stopped = True
        if self._batcher is not None:
            await self._batcher.close()
        self._request = None
        if self._executor is not None:
            self._executor.shutdown(wait=False)
        gc.collect()
