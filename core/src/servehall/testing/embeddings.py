"""Reference embeddings for engine tests: transformers' own model and tokenizer, pooled
and normalised by hand (independent of :mod:`servehall.engines.pooling`), for models like
all-MiniLM-L6-v2 (mean pooling, a ``Normalize`` module). Needs torch and transformers."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def transformers_embeddings(model_dir: Path, texts: list[str], max_length: int = 256) -> Any:
    """``[len(texts), hidden]`` float32 numpy array: ``AutoTokenizer`` (padding,
    truncation to ``max_length`` tokens), ``AutoModel``'s ``last_hidden_state``, mean over
    the attention mask, L2 normalisation."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    model = AutoModel.from_pretrained(str(model_dir)).eval()
    enc = tok(texts, padding=True, truncation=True, max_length=max_length, return_tensors="pt")
    with torch.inference_mode():
        out = model(**enc).last_hidden_state
    m = enc["attention_mask"].unsqueeze(-1).float()
    mean = (out * m).sum(1) / m.sum(1).clamp(min=1e-9)
    return torch.nn.functional.normalize(mean, p=2, dim=1).numpy()


def cosine(a: Any, b: Any) -> float:
    """Cosine similarity of two vectors (sequences or numpy arrays), in float64."""
    import numpy as np

    x, y = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(x @ y / (np.linalg.norm(x) * np.linalg.norm(y)))
