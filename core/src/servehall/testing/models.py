"""Tiny Hugging Face models for engine tests (built locally in seconds, no download).

:func:`build_tiny_llama` writes a random ``LlamaForCausalLM`` without tokenizer: enough
for engine-level tests that speak token ids. Its weights use a large initializer range so
logits are well separated and greedy decoding is stable across batch shapes (a model with
near-uniform logits can flip an argmax on float rounding alone). Needs torch and
transformers (extra ``servehall[torch]``).

:func:`build_tiny_sentence_encoder` writes a random BERT encoder as a sentence-transformers
model directory (``modules.json``: transformer, mean pooling, optionally a ``Dense``
projection, ``Normalize``), with a word-level tokenizer; it needs sentence-transformers
too (requirements/dev.txt).
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


TINY_WORDS = ("hello", "world", "the", "quick", "brown", "fox", "a", "b")
"""The words of :func:`build_tiny_sentence_encoder`'s vocabulary (after BERT's specials)."""


def build_tiny_sentence_encoder(
    out: Path, *, dense_out_features: int | None = None, hidden_size: int = 32, seed: int = 0
) -> Path:
    """Write a tiny random sentence-transformers encoder at ``out`` (idempotent) and return
    it: a 2-layer BERT (``hidden_size`` 32, 4 heads, 64 positions), an uncased WordPiece
    vocabulary of BERT's special tokens and :data:`TINY_WORDS`, mean pooling, then a
    ``Dense`` projection to ``dense_out_features`` floats (tanh, sentence-transformers'
    default) when given, then ``Normalize``; saved by sentence-transformers itself.
    """
    out = Path(out)
    if (out / "modules.json").is_file():
        return out
    import torch
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.models import Dense, Normalize, Pooling, Transformer
    from transformers import BertConfig, BertModel, BertTokenizer

    out.mkdir(parents=True, exist_ok=True)
    vocab = out / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *TINY_WORDS]) + "\n")
    BertTokenizer(vocab_file=str(vocab)).save_pretrained(str(out))
    fields: dict[str, Any] = {
        "vocab_size": 5 + len(TINY_WORDS),
        "hidden_size": hidden_size,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "intermediate_size": hidden_size * 2,
        "max_position_embeddings": 64,
    }
    torch.manual_seed(seed)
    BertModel(BertConfig(**fields)).eval().save_pretrained(str(out))
    modules: list[Any] = [
        Transformer(str(out), max_seq_length=64),
        Pooling(hidden_size, pooling_mode="mean"),
    ]
    if dense_out_features is not None:
        modules.append(Dense(hidden_size, dense_out_features))
    modules.append(Normalize())
    SentenceTransformer(modules=modules, device="cpu").save(str(out))
    return out
