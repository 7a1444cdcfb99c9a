"""The torch engine for ``[[models]] task = "embed"``: transformers' ``AutoModel`` plus the
model's own pooling (:mod:`servehall.engines.pooling`: mean / CLS / ... over the
attention mask, L2 normalisation when the model has a ``Normalize`` module), as
sentence-transformers computes it.

Batching: the inputs of every :meth:`TorchEmbeddingEngine.embed` call that arrives while
a forward pass runs wait in one queue; the next pass takes them all (several requests in
one padded batch, split into passes of at most :data:`BATCH_TOKENS` padded tokens), on
one device thread (:class:`servehall.engines.embedbatch.EmbedBatcher`, shared with the
``openvino_cpu`` embedding engine). No KV cache: ``stats()`` reports requests in the pass
as running and the queued ones as waiting, with 0 of 1 KV blocks.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
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
)
from servehall.engines.embedbatch import EmbedBatcher, padded_passes, refuse_generation
from servehall.engines.kit import DeltaStream
from servehall.engines.pooling import PoolingConfig, pool, read_pooling
from servehall.engines.torch.device import TorchDevice, open_model
from servehall.engines.torch.options import TorchOptions
from servehall.errors import ConfigError, EngineError, EngineUnavailableError

log = logging.getLogger("servehall.engines.torch")

BATCH_TOKENS = 16_384
"""Most padded tokens (inputs × longest input) in one forward pass."""


class TorchEmbeddingEngine:
    """An embedding model (a Hugging Face encoder directory) on one torch device.

    Args:
        model: the ``[[models]]`` entry (``task = "embed"``); ``options`` as for the
            torch engine (``dtype``, ``device_index``, ``attn_implementation``; the KV
            cache options are unused).
        device: the device adapter.
        backend: the backend name reported in ``Engine.backend``.

    Raises:
        ConfigError: invalid options, no ``config.json``, an unsupported pooling.
    """

    supported_params: frozenset[str] = frozenset()

    def __init__(self, model: ModelConfig, device: TorchDevice, backend: str) -> None:
        self.backend = backend
        self.name = model.name
        self.path = Path(model.path)
        self.device = device
        self.options: TorchOptions
        self.options, facts = open_model(model, device)
        self.pooling: PoolingConfig = read_pooling(self.path)
        native = min(facts.max_position_embeddings, self.pooling.max_seq_length or 1 << 30)
        self._max_model_len = min(model.max_model_len or native, native)
        self._vocab_size = facts.vocab_size
        hidden = facts.config.get("hidden_size")
        self._dim = int(hidden) if isinstance(hidden, int) else 0
        pad = facts.config.get("pad_token_id")
        self._pad_id = int(pad) if isinstance(pad, int) else 0
        self._dtype: str | None = None
        self._model: Any = None
        self._executor: ThreadPoolExecutor | None = None
        self._batcher: EmbedBatcher | None = None
        self._started = False
        self._stopped = False

    @property
    def model_info(self) -> ModelInfo:
        """Input length limit, vocabulary, and in ``extra``: ``task``, ``embedding_dim``,
        ``pooling``, ``normalize``, ``matryoshka``, ``matryoshka_dimensions``."""
        return ModelInfo(
            max_model_len=self._max_model_len,
            vocab_size=self._vocab_size,
            extra={
                "task": "embed",
                "dtype": self._dtype or self.options.dtype,
                "embedding_dim": self._dim,
                "pooling": self.pooling.mode,
                "normalize": self.pooling.normalize,
                "matryoshka": self.pooling.matryoshka,
                "matryoshka_dimensions": list(self.pooling.matryoshka_dimensions),
                **self.device.describe(self.options),
            },
        )

    async def start(self) -> None:
        """Load the weights on the device thread.

        Raises:
            EngineError: the weights fail to load.
        """
        if self._started:
            return
        opts = self.options
        self._executor = ThreadPoolExecutor(
            1,
            thread_name_prefix=f"embed-{self.name}",
            initializer=self.device.thread_setup,
            initargs=(opts,),
        )
        try:
            await asyncio.get_running_loop().run_in_executor(self._executor, self._load)
        except (ConfigError, EngineError):
            raise
        except Exception as exc:
            log.exception("torch embedding engine for %s failed to start", self.name)
            raise EngineError(
                f"model {self.name!r} failed to load on {self.backend}: {type(exc).__name__}: {exc}"
            ) from exc
        self._batcher = EmbedBatcher(self.name, self._executor, self._forward_all, log)
        self._started = True

    def _load(self) -> None:
        import torch
        from transformers import AutoModel

        opts = self.options
        self.device.setup(opts)
        self._dtype = self.device.resolve_dtype(opts)
        model: Any = AutoModel.from_pretrained(
            str(self.path),
            dtype=getattr(torch, self._dtype),
            attn_implementation=opts.attn_implementation,
        )
        self._model = model.to(self.device.torch_device(opts)).eval()
        dim = getattr(model.config, "hidden_size", None)
        if isinstance(dim, int):
            self._dim = dim
        log.info(
            "torch embedding engine %s on %s: dtype=%s pooling=%s normalize=%s dim=%d "
            "max_model_len=%d",
            self.name,
            self.device.torch_device(opts),
            self._dtype,
            self.pooling.mode,
            self.pooling.normalize,
            self._dim,
            self._max_model_len,
        )

    async def embed(self, inputs: Sequence[Sequence[int]]) -> list[list[float]]:
        """One vector per input (see :meth:`EmbeddingEngine.embed
        <servehall.engines.contract.EmbeddingEngine.embed>`), batched with the other
        calls waiting for the next forward pass.

        Raises:
            EngineUnavailableError: not started or shut down.
            EngineError: the forward pass failed.
        """
        if not self._started or self._stopped or self._batcher is None:
            raise EngineUnavailableError(f"the engine of model {self.name!r} is not running")
        return await self._batcher.embed(inputs)

    def _forward_all(self, inputs: list[list[int]]) -> list[list[float]]:
        """*Device thread.* Every input's vector, in passes of at most
        :data:`BATCH_TOKENS` padded tokens."""
        out: list[list[float]] = []
        for start, end, longest in padded_passes(inputs, BATCH_TOKENS):
            out.extend(self._forward(inputs[start:end], longest))
        return out

    def _forward(self, inputs: list[list[int]], longest: int) -> list[list[float]]:
        import torch

        device = self.device.torch_device(self.options)
        ids = torch.full((len(inputs), longest), self._pad_id, dtype=torch.long)
        mask = torch.zeros((len(inputs), longest), dtype=torch.long)
        for i, row in enumerate(inputs):
            ids[i, : len(row)] = torch.tensor(row, dtype=torch.long)
            mask[i, : len(row)] = 1
        ids, mask = ids.to(device), mask.to(device)
        with torch.inference_mode():
            hidden = self._model(input_ids=ids, attention_mask=mask).last_hidden_state
            pooled = pool(hidden, mask, self.pooling)
        vectors: list[list[float]] = pooled.cpu().tolist()
        return vectors

    def add_request(
        self, request_id: str, prompt_token_ids: Sequence[int], params: SamplingParams
    ) -> DeltaStream:
        """Refused: an embedding model does not generate (the stream holds one
        ``finish_reason="error"`` delta, ``code="invalid_request"``)."""
        return refuse_generation(self.name, request_id)

    async def abort(self, request_id: str) -> None:
        """Nothing to abort: :meth:`add_request` never starts a request."""

    async def health(self) -> EngineHealth:
        """``ok`` once the weights are loaded, until shutdown."""
        if self._stopped:
            return EngineHealth(False, "engine is shut down")
        if not self._started:
            return EngineHealth(False, "engine is not started")
        return EngineHealth(True)

    def stats(self) -> EngineStats:
        """Embedding calls in the forward pass (running) and queued (waiting); no KV
        cache (0 of 1 blocks); device memory."""
        used, total = self.device.memory_usage(self.options)
        b = self._batcher
        return EngineStats(b.running if b else 0, b.waiting if b else 0, 0, 1, used, total)

    async def shutdown(self) -> None:
        """Fail queued calls, free the model. Idempotent."""
        if self._stopped:
            return
        self._stopped = True
        if self._batcher is not None:
            await self._batcher.close()
        self._model = None
        if self._executor is not None:
            self._executor.shutdown(wait=False)
        gc.collect()
        with contextlib.suppress(Exception):
            self.device.release(self.options)
