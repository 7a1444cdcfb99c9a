"""``servehall.engines.pooling``: sentence-transformers pooling configs read from a model
directory, pooling a padded batch, and Matryoshka truncation."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from servehall.engines.pooling import PoolingConfig, pool, pool_numpy, read_pooling, truncate
from servehall.errors import ConfigError


def test_truncate_renormalises() -> None:
    assert truncate([3.0, 4.0, 12.0], 2, normalize=True) == [0.6, 0.8]
    assert truncate([3.0, 4.0, 12.0], 2, normalize=False) == [3.0, 4.0]
    assert truncate([0.0, 0.0, 1.0], 2, normalize=True) == [0.0, 0.0]


# --- pooling ---------------------------------------------------------------------------


def _st_dir(tmp_path: Path, pooling: dict[str, Any], normalize: bool) -> Path:
    tmp_path.mkdir()
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {
            "idx": 1,
            "name": "1",
            "path": "1_Pooling",
            "type": "sentence_transformers.models.Pooling",
        },
    ]
    if normalize:
        modules.append(
            {
                "idx": 2,
                "name": "2",
                "path": "2_Normalize",
                "type": "sentence_transformers.models.Normalize",
            }
        )
    (tmp_path / "modules.json").write_text(json.dumps(modules))
    (tmp_path / "1_Pooling").mkdir()
    (tmp_path / "1_Pooling" / "config.json").write_text(
        json.dumps({"word_embedding_dimension": 4, **pooling})
    )
    (tmp_path / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 128}))
    return tmp_path


def test_read_pooling(tmp_path: Path) -> None:
    assert read_pooling(tmp_path) == PoolingConfig("mean", True)  # no modules.json
    d = _st_dir(tmp_path / "cls", {"pooling_mode_cls_token": True}, normalize=False)
    assert read_pooling(d) == PoolingConfig("cls", False, 128)
    d = _st_dir(
        tmp_path / "mean",
        {"pooling_mode_mean_tokens": True, "pooling_mode_cls_token": False},
        normalize=True,
    )
    (d / "config.json").write_text(json.dumps({"matryoshka_dimensions": [2, 4]}))
    assert read_pooling(d) == PoolingConfig("mean", True, 128, True, (2, 4))
    d = _st_dir(
        tmp_path / "two",
        {"pooling_mode_mean_tokens": True, "pooling_mode_cls_token": True},
        normalize=True,
    )
    with pytest.raises(ConfigError, match="not supported"):
        read_pooling(d)
    d = _st_dir(tmp_path / "wkpooling", {"pooling_mode_weightedmean_tokens": True}, True)
    with pytest.raises(ConfigError, match="weightedmean"):
        read_pooling(d)


def test_read_pooling_of_sentence_transformers_6(tmp_path: Path) -> None:
    """sentence-transformers 6 saves one ``pooling_mode`` name (and reads it before any
    legacy boolean); a list of one name is that name."""
    for name, mode in [("mean", "mean"), ("cls", "cls"), ("mean_sqrt_len_tokens", "mean_sqrt_len")]:
        d = _st_dir(tmp_path / name, {"pooling_mode": name}, normalize=True)
        assert read_pooling(d) == PoolingConfig(mode, True, 128)
    d = _st_dir(tmp_path / "list", {"pooling_mode": ["max"], "pooling_mode_cls_token": True}, False)
    assert read_pooling(d) == PoolingConfig("max", False, 128)
    for i, bad in enumerate(["weightedmean", ["mean", "max"], 3]):
        d = _st_dir(tmp_path / f"bad{i}", {"pooling_mode": bad}, normalize=True)
        with pytest.raises(ConfigError, match=r"pooling_mode .* is not supported"):
            read_pooling(d)


def test_max_seq_length_of_sentence_transformers_6_is_the_tokenizers(tmp_path: Path) -> None:
    """sentence-transformers 6 writes no ``max_seq_length``: the tokenizer's
    ``model_max_length`` is the limit, as its Transformer module reads it; transformers'
    "unset" (``int(1e30)``) is no limit."""
    d = _st_dir(tmp_path / "st6", {"pooling_mode": "mean"}, normalize=True)
    (d / "sentence_bert_config.json").write_text(json.dumps({"module_output_name": "x"}))
    assert read_pooling(d).max_seq_length is None
    (d / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 64}))
    assert read_pooling(d).max_seq_length == 64
    (d / "tokenizer_config.json").write_text(json.dumps({"model_max_length": int(1e30)}))
    assert read_pooling(d).max_seq_length is None
    # the sentence-transformers config, when it has one, wins
    (d / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 64}))
    (d / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 32}))
    assert read_pooling(d).max_seq_length == 32


def test_a_model_saved_by_sentence_transformers_6_has_its_input_limit(tmp_path: Path) -> None:
    pytest.importorskip("sentence_transformers")
    from servehall.testing.models import build_tiny_sentence_encoder

    d = build_tiny_sentence_encoder(tmp_path / "tiny")
    assert "max_seq_length" not in json.loads((d / "sentence_bert_config.json").read_text())
    assert read_pooling(d).max_seq_length == 64  # the tokenizer's, as it was saved


def _add_dense(d: Path, idx: int, config: dict[str, Any]) -> None:
    modules = json.loads((d / "modules.json").read_text())
    path = f"{idx}_Dense"
    modules.insert(idx, {"idx": idx, "name": str(idx), "path": path, "type": "x.Dense"})
    (d / "modules.json").write_text(json.dumps(modules))
    (d / path).mkdir()
    (d / path / "config.json").write_text(json.dumps(config))


def test_read_pooling_reads_dense_projections(tmp_path: Path) -> None:
    """Each ``Dense`` module's ``out_features``, in order (the model's vectors are the
    last one's size); a Dense module without a positive integer ``out_features`` is a
    config error."""
    d = _st_dir(tmp_path / "none", {"pooling_mode": "mean"}, normalize=True)
    assert read_pooling(d).dense_out_features == ()
    d = _st_dir(tmp_path / "two", {"pooling_mode": "mean"}, normalize=True)
    _add_dense(d, 2, {"in_features": 4, "out_features": 16})
    _add_dense(d, 3, {"in_features": 16, "out_features": 8})
    assert read_pooling(d) == PoolingConfig("mean", True, 128, dense_out_features=(16, 8))
    for i, bad in enumerate([{}, {"out_features": 0}, {"out_features": "8"}]):
        d = _st_dir(tmp_path / f"bad{i}", {"pooling_mode": "mean"}, normalize=True)
        _add_dense(d, 2, bad)
        with pytest.raises(ConfigError, match="out_features"):
            read_pooling(d)


def test_pool_masks_padding() -> None:
    torch = pytest.importorskip("torch")
    hidden = torch.tensor(
        [[[1.0, 0.0], [3.0, 4.0], [100.0, 100.0]], [[2.0, 2.0], [50.0, 50.0], [9.0, 9.0]]]
    )
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    mean = pool(hidden, mask, PoolingConfig("mean", False))
    assert mean.tolist() == [[2.0, 2.0], [2.0, 2.0]]
    cls = pool(hidden, mask, PoolingConfig("cls", False))
    assert cls.tolist() == [[1.0, 0.0], [2.0, 2.0]]
    mx = pool(hidden, mask, PoolingConfig("max", False))
    assert mx.tolist() == [[3.0, 4.0], [2.0, 2.0]]
    last = pool(hidden, mask, PoolingConfig("lasttoken", False))
    assert last.tolist() == [[3.0, 4.0], [2.0, 2.0]]
    normed = pool(hidden, mask, PoolingConfig("mean", True))
    assert torch.allclose(normed.norm(dim=1), torch.ones(2))


def test_pool_numpy_masks_padding() -> None:
    hidden = np.array(
        [[[1.0, 0.0], [3.0, 4.0], [100.0, 100.0]], [[2.0, 2.0], [50.0, 50.0], [9.0, 9.0]]]
    )
    mask = np.array([[1, 1, 0], [1, 0, 0]])
    assert pool_numpy(hidden, mask, PoolingConfig("mean", False)).tolist() == [[2, 2], [2, 2]]
    assert pool_numpy(hidden, mask, PoolingConfig("cls", False)).tolist() == [[1, 0], [2, 2]]
    assert pool_numpy(hidden, mask, PoolingConfig("max", False)).tolist() == [[3, 4], [2, 2]]
    last = pool_numpy(hidden, mask, PoolingConfig("lasttoken", False))
    assert last.tolist() == [[3, 4], [2, 2]]
    sqrt = pool_numpy(hidden, mask, PoolingConfig("mean_sqrt_len", False))
    assert np.allclose(sqrt, [[4 / 2**0.5, 4 / 2**0.5], [2, 2]])
    normed = pool_numpy(hidden, mask, PoolingConfig("mean", True))
    assert normed.dtype == np.float32 and np.allclose(np.linalg.norm(normed, axis=1), 1)
    zero = pool_numpy(np.zeros((1, 2, 3)), np.ones((1, 2)), PoolingConfig("mean", True))
    assert zero.tolist() == [[0, 0, 0]]  # no NaN from a zero vector


@pytest.mark.parametrize("mode", ["mean", "cls", "max", "mean_sqrt_len", "lasttoken"])
@pytest.mark.parametrize("normalize", [False, True])
def test_pool_numpy_equals_torch_pool(mode: str, normalize: bool) -> None:
    """The numpy pooling (openvino_cpu) gives the torch pooling's vectors."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(7)
    hidden = rng.standard_normal((4, 6, 8)).astype(np.float32)
    mask = np.zeros((4, 6), dtype=np.int64)
    for i, n in enumerate((6, 1, 3, 5)):
        mask[i, :n] = 1
    config = PoolingConfig(mode, normalize)  # type: ignore[arg-type]
    expected = pool(torch.from_numpy(hidden), torch.from_numpy(mask), config).numpy()
    assert np.allclose(pool_numpy(hidden, mask, config), expected, atol=1e-6)
