"""Reference embeddings for embedding-engine tests, computed without any engine of ours.

:func:`mean_pooled_reference` runs transformers' own tokenizer and model on texts and
pools them as all-MiniLM-L6-v2's sentence-transformers modules do (mean over the
attention mask, L2 normalisation, by hand: independent of
:mod:`servehall.engines.pooling`): the vectors an engine serving that model must match.
Needs torch and transformers (extra ``servehall[torch]``).

:func:`embed_while_busy` drives an engine built on
:class:`~servehall.engines.embedbatch.EmbeddingEngineBase` so that calls queue behind a
pass, counting its forward passes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def mean_pooled_reference(model_dir: Path, texts: Sequence[str], *, max_length: int = 256) -> Any:
    """transformers' embeddings of ``texts``: ``AutoTokenizer`` (padding, truncation to
    ``max_length`` tokens), ``AutoModel``'s last hidden state, mean over the attention
    mask, L2-normalised.

    Returns:
        a float32 numpy array of shape ``(len(texts), hidden_size)``.
    """
    import torch
    from transformers import AutoModel, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    model = AutoModel.from_pretrained(str(model_dir)).eval()
    enc = tok(
        list(texts), padding=True, truncation=True, max_length=max_length, return_tensors="pt"
    )
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


async def embed_while_busy(
    engine: Any, inputs: Sequence[Sequence[int]]
) -> tuple[list[list[float]], int, Any]:
    """Embed ``inputs[0]`` in a call of its own, then each other input in a call of its
    own while that first pass runs (they queue for the next pass), on a started engine
    built on :class:`~servehall.engines.embedbatch.EmbeddingEngineBase` (its
    ``_forward`` is wrapped to count passes, for good).

    Returns:
        the vectors in input order, the forward passes run (2 when the queued calls
        shared one pass, on inputs within one pass's token budget), and
        ``engine.stats()`` read while the later calls were queued.
    """
    passes = 0
    forward = engine._forward

    def counting(*args: Any) -> Any:
        nonlocal passes
        passes += 1
        return forward(*args)

    engine._forward = counting
    first = asyncio.ensure_future(engine.embed(list(inputs[:1])))
    await asyncio.sleep(0)  # the first pass starts with this call alone
    rest = [asyncio.ensure_future(engine.embed([x])) for x in inputs[1:]]
    await asyncio.sleep(0)  # they queue while the first pass runs
    stats = engine.stats()
    vectors = [*(await first), *[v for r in rest for v in await r]]
    return vectors, passes, stats
