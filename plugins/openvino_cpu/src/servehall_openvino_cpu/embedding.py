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

Batching: every ``embed`` call that arrives while an inference runs waits for the next
one, which takes them all (:class:`servehall.EmbeddingEngineBase`, shared with the torch
embedding engine), padded to the longest input and split into inferences of at most
``batch_tokens`` padded tokens, on one inference thread. No KV cache: ``stats()`` reports
the calls in the inference as running, the queued ones as waiting, 0 of 1 KV blocks.
"""

from __future__ import annotations

import gc
import logging
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from servehall import (
    ConfigError,
    EmbeddingEngineBase,
    EngineError,
    ModelConfig,
    ModelInfo,
    embedding_facts,
    pool_numpy,
)
from servehall_openvino_cpu.convert import EMBED_TASK, resolve_ir_dir
from servehall_openvino_cpu.options import OpenVINOOptions
from servehall_openvino_cpu.probe import open_model

log = logging.getLogger("servehall.openvino_cpu")

BACKEND = "openvino_cpu"
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


class OpenVINOEmbeddingEngine(EmbeddingEngineBase):
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

    def __init__(self, model: ModelConfig) -> None:
        path, self.options, facts = open_model(model)
        check_embed_options(self.options, model.name)
        super().__init__(model, path, facts, log, f"openvino_cpu: loading {path} failed")
        self._ir_dir: Path | None = None
        self._request: Any = None  # openvino.InferRequest (inference thread only)
        self._inputs: tuple[str, ...] = ()

    @property
    def model_info(self) -> ModelInfo:
        """Input length limit, vocabulary, and in ``extra``: ``task``, ``embedding_dim``,
        ``pooling``, ``normalize``, ``matryoshka``, ``matryoshka_dimensions``
        (:func:`servehall.embedding_facts`), ``inference_precision``, ``weight_format``,
        ``ir_dir``."""
        return ModelInfo(
            max_model_len=self._max_model_len,
            vocab_size=self._vocab_size,
            extra={
                **embedding_facts(self.pooling, self._dim),
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

    def _new_executor(self) -> ThreadPoolExecutor:
        return ThreadPoolExecutor(1, thread_name_prefix=f"ov-embed-{self.name}")

    def _load(self) -> None:
        """*Inference thread.* Convert if needed and compile the IR for the CPU.

        Raises:
            ConfigError: not a model directory; EngineError: conversion or compilation
            failed, or the IR is not an encoder this engine can feed.
        """
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

    def _unload(self) -> None:
        self._request = None
        gc.collect()
