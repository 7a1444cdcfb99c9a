"""``servehall demo-model --size``: the sizes' shapes (parameter counts on torch's meta
device, nothing trained) and the builder's size checks."""

from __future__ import annotations

from pathlib import Path

import pytest

from servehall.demo import build_demo_model, default_demo_dir
from servehall.demo.model import SIZES, llama_config


class _Tok:
    """The two tokenizer calls ``llama_config`` makes (ids of the special tokens)."""

    def get_vocab_size(self) -> int:
        return 2048

    def token_to_id(self, token: str) -> int:
        return {"<|begin_of_text|>": 0, "<|end_of_text|>": 1, "<|pad|>": 2, "<|end|>": 6}[token]


def _params(size: str) -> int:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = llama_config(_Tok(), SIZES[size])  # type: ignore[arg-type]
    with torch.device("meta"):
        model = LlamaForCausalLM(
            LlamaConfig(**{k: v for k, v in cfg.items() if k != "architectures"})
        )
    return sum(p.numel() for p in model.parameters())


def test_demo_size_is_about_1_3_m_and_small_is_20_to_30_m() -> None:
    assert 1.0e6 < _params("demo") < 1.6e6
    assert 20e6 <= _params("small") <= 30e6


def test_sizes_have_their_own_default_directories() -> None:
    assert default_demo_dir().name == "demo-model"
    assert default_demo_dir("small").name == "demo-model-small"


def test_unknown_size_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown demo model size 'huge'"):
        build_demo_model(tmp_path / "m", size="huge")
