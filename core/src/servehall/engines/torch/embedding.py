"""The torch engine for ``[[models]] task = "embed"``: transformers' ``AutoModel`` plus the
model's own pooling (:mod:`servehall.engines.pooling`: mean / CLS / ... over the
attention mask, L2 normalisation when the model has a ``Normalize`` module), as
sentence-transformers computes it.

Batching: the inputs of every ``embed`` call that arrives while a forward pass runs wait
in one queue; the next pass takes them all (several requests in one padded batch, split
into passes of at most ``batch_tokens`` padded tokens), on one device thread
(:class:`servehall.engines.embedbatch.EmbeddingEngineBase`, shared with the
``openvino_cpu`` embedding engine). No KV cache: ``stats()`` reports requests in the pass
as running and the queued ones as waiting, with 0 of 1 KV blocks, and the device's memory.
"""

from __future__ import annotations

import contextlib
import gc
import logging
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from servehall.config.models import ModelConfig
from servehall.engines.contract import EngineStats, ModelInfo
from servehall.engines.embedbatch import EmbeddingEngineBase
from servehall.engines.pooling import embedding_facts, pool
from servehall.engines.torch.device import TorchDevice, open_model
from servehall.engines.torch.options import TorchOptions

log = logging.getLogger("servehall.engines.torch")


class TorchEmbeddingEngine(EmbeddingEngineBase):
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

    def __init__(self, model: ModelConfig, device: TorchDevice, backend: str) -> None:
        self.backend = backend
        self.device = device
        self.options: TorchOptions
        self.options, facts = open_model(model, device)
        super().__init__(
            model,
            Path(model.path),
            facts,
            log,
            f"model {model.name!r} failed to load on {backend}",
        )
        self._dtype: str | None = None
        self._model: Any = None

    @property
    def model_info(self) -> ModelInfo:
        """Input length limit, vocabulary, and in ``extra``: ``task``, ``embedding_dim``,
        ``pooling``, ``normalize``, ``matryoshka``, ``matryoshka_dimensions``
        (:func:`~servehall.engines.pooling.embedding_facts`), ``dtype`` and the device's
        description."""
        return ModelInfo(
            max_model_len=self._max_model_len,
            vocab_size=self._vocab_size,
            extra={
                **embedding_facts(self.pooling, self._dim),
                "dtype": self._dtype or self.options.dtype,
                **self.device.describe(self.options),
            },
        )

    def _new_executor(self) -> ThreadPoolExecutor:
        return ThreadPoolExecutor(
            1,
            thread_name_prefix=f"embed-{self.name}",
            initializer=self.device.thread_setup,
            initargs=(self.options,),
        )

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

    def stats(self) -> EngineStats:
        """Embedding calls in the forward pass (running) and queued (waiting); no KV
        cache (0 of 1 blocks); device memory."""
        used, total = self.device.memory_usage(self.options)
        base = super().stats()
        return EngineStats(base.running, base.waiting, 0, 1, used, total)

    def _unload(self) -> None:
        self._model = None
        gc.collect()
        with contextlib.suppress(Exception):
            self.device.release(self.options)
