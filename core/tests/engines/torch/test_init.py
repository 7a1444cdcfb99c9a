"""Tests of the servehall.engines.torch package: ``torch_engine_factory`` builds an
unstarted generation or embedding engine per the model's task, validating options first,
and the engine classes load on first access."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import servehall.engines.torch as torch_pkg
from servehall import ConfigError, ModelConfig
from servehall.engines.torch import CpuDevice, TorchDevice, torch_engine_factory

pytest.importorskip("torch")


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    """A config.json only: building an engine reads no weights."""
    cfg = {
        "model_type": "llama",
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "hidden_size": 8,
        "max_position_embeddings": 64,
        "vocab_size": 10,
    }
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    return tmp_path


def test_factory_builds_by_task(model_dir: Path) -> None:
    from servehall.engines.torch.embedding import TorchEmbeddingEngine
    from servehall.engines.torch.engine import TorchEngine

    devices: list[TorchDevice] = []

    def device() -> TorchDevice:
        d = CpuDevice()
        devices.append(d)
        return d

    factory = torch_engine_factory(device, "cpu")
    assert factory.__doc__ == "Build a torch engine for backend 'cpu'."
    gen = factory(ModelConfig(name="m", path=model_dir, backend="cpu"))
    emb = factory(ModelConfig(name="e", path=model_dir, backend="cpu", task="embed"))
    assert type(gen) is TorchEngine and type(emb) is TorchEmbeddingEngine
    assert len(devices) == 2 and devices[0] is not devices[1]  # one device per engine


def test_factory_validates_options(model_dir: Path) -> None:
    factory = torch_engine_factory(CpuDevice, "cpu")
    with pytest.raises(ConfigError) as err:
        factory(ModelConfig(name="m", path=model_dir, backend="cpu", options={"dtipe": "bf16"}))
    assert err.value.errors[0][0] == "models.m.options.dtipe"


def test_engine_classes_load_lazily() -> None:
    assert torch_pkg.TorchEngine.__module__ == "servehall.engines.torch.engine"
    assert torch_pkg.TorchEmbeddingEngine.__module__ == "servehall.engines.torch.embedding"
    with pytest.raises(AttributeError, match="has no attribute 'TorchTrainer'"):
        _ = torch_pkg.TorchTrainer  # type: ignore[attr-defined]
    assert set(torch_pkg.__all__) >= {"TorchEngine", "torch_engine_factory", "CpuDevice"}
