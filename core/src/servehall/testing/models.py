"""Tiny Hugging Face models for engine tests (built locally in seconds, no download).

:func:`build_tiny_llama` writes a random ``LlamaForCausalLM`` without tokenizer: enough
for engine-level tests that speak token ids. Its weights use a large initializer range so
logits are well separated and greedy decoding is stable across batch shapes (a model with
near-uniform logits can flip an argmax on float rounding alone). Needs torch and
transformers (extra ``servehall[torch]``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

TINY_VOCAB = 512
TINY_EOS = 2


def build_tiny_llama(
    out: Path,
    *,
    seed: int = 0,
    vocab_size: int = TINY_VOCAB,
    hidden_size: int = 64,
    num_layers: int = 2,
    max_position_embeddings: int = 512,
    initializer_range: float = 0.4,
) -> Path:
    """Write a tiny random Llama model directory at ``out`` (idempotent) and return it.

    Shapes: ``hidden_size`` 64, 4 attention heads over 2 KV heads (grouped-query attention),
    ``num_layers`` 2, vocabulary ``vocab_size`` (EOS id 2, BOS id 1), context
    ``max_position_embeddings`` tokens, float32 safetensors.
    """
    out = Path(out)
    if (out / "config.json").is_file() and (out / "model.safetensors").is_file():
        return out
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    fields: dict[str, Any] = {
        "vocab_size": vocab_size,
        "hidden_size": hidden_size,
        "intermediate_size": hidden_size * 2,
        "num_hidden_layers": num_layers,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": max_position_embeddings,
        "bos_token_id": 1,
        "eos_token_id": TINY_EOS,
        "initializer_range": initializer_range,
        "tie_word_embeddings": False,
    }
    config = LlamaConfig(**fields)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).eval()
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    GenerationConfig(bos_token_id=1, eos_token_id=TINY_EOS).save_pretrained(out)
    return out
