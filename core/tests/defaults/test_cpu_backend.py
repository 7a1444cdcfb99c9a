"""Tests of servehall.defaults.cpu_backend: backend ``cpu`` (the torch engine on the host
CPU, with the ONNX Runtime and vLLM engines as options), its import-light probe and its
place in ``auto``."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from servehall.config.models import ModelConfig
from servehall.defaults.cpu_backend import (
    CPU_AUTO_PRIORITY,
    _fp32,
    probe_cpu,
    servehall_register_backends,
)
from servehall.engines.backends import ACCELERATOR_PRIORITY, BackendRegistry
from servehall.errors import ConfigError


def test_registered_as_the_last_resort_of_auto() -> None:
    reg = BackendRegistry()
    servehall_register_backends(reg)
    spec = reg.get("cpu")
    assert spec.auto_priority == CPU_AUTO_PRIORITY < ACCELERATOR_PRIORITY
    assert "options.engine = 'onnxruntime'" in spec.description
    assert _fp32() == "float32"


def test_probe_names_each_engine_here() -> None:
    result = probe_cpu()
    have = all(importlib.util.find_spec(m) for m in ("torch", "transformers"))
    assert result.available is bool(have)
    if have:
        assert result.reason.startswith("torch on the host CPU; engine onnxruntime: ")
        assert "; engine vllm: " in result.reason


def test_the_factory_refuses_an_unknown_engine(tmp_path: Path) -> None:
    reg = BackendRegistry()
    servehall_register_backends(reg)
    (tmp_path / "config.json").write_text("{}")
    model = ModelConfig(name="m", path=tmp_path, backend="cpu", options={"engine": "tpu"})
    with pytest.raises(ConfigError, match="engine"):
        reg.get("cpu").factory(model)
