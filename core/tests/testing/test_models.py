"""Tests of servehall.testing.models: the tiny random Llama built locally — its
config, weights and generation config, determinism in the seed, idempotence."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from servehall.testing.models import TINY_EOS, build_tiny_llama

pytest.importorskip("torch")
pytest.importorskip("transformers")


def test_build_writes_a_llama_with_the_asked_shapes(tmp_path: Path) -> None:
    out = build_tiny_llama(
        tmp_path / "m", vocab_size=64, hidden_size=32, num_layers=1, max_position_embeddings=128
    )
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLM"]
    assert (cfg["vocab_size"], cfg["hidden_size"], cfg["num_hidden_layers"]) == (64, 32, 1)
    assert (cfg["num_attention_heads"], cfg["num_key_value_heads"]) == (4, 2)
    assert cfg["max_position_embeddings"] == 128 and cfg["eos_token_id"] == TINY_EOS
    gen = json.loads((out / "generation_config.json").read_text())
    assert (gen["bos_token_id"], gen["eos_token_id"]) == (1, TINY_EOS)
    assert (out / "model.safetensors").stat().st_size > 0
    assert not (out / "tokenizer.json").exists()  # token ids only


def test_build_is_deterministic_and_idempotent(tmp_path: Path) -> None:
    kw = dict(vocab_size=64, hidden_size=32, num_layers=1)
    a = build_tiny_llama(tmp_path / "a", seed=3, **kw)  # type: ignore[arg-type]
    b = build_tiny_llama(tmp_path / "b", seed=3, **kw)  # type: ignore[arg-type]
    c = build_tiny_llama(tmp_path / "c", seed=4, **kw)  # type: ignore[arg-type]
    weights = [(p / "model.safetensors").read_bytes() for p in (a, b, c)]
    assert weights[0] == weights[1] and weights[0] != weights[2]
    mtime = (a / "model.safetensors").stat().st_mtime_ns
    assert build_tiny_llama(a, seed=99) == a  # present: left alone, whatever the seed
    assert (a / "model.safetensors").stat().st_mtime_ns == mtime
