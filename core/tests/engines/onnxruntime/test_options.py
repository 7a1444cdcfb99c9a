"""ONNX Runtime engine: options and engine choice (the probe is test_probe.py, the model
build cache test_build.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from servehall.config.models import ModelConfig
from servehall.engines.onnxruntime import (
    parse_ort_options,
)
from servehall.engines.select import engine_factory
from servehall.engines.torch import CpuDevice
from servehall.errors import ConfigError


def test_defaults_follow_the_provider() -> None:
    cpu = parse_ort_options({}, model="m", default_provider="cpu")
    assert (cpu.provider, cpu.precision, cpu.paged_attention) == ("cpu", "fp32", False)
    gpu = parse_ort_options({"engine": "onnxruntime"}, model="m", default_provider="cuda")
    assert (gpu.provider, gpu.precision, gpu.paged_attention) == ("cuda", "fp16", True)
    forced = parse_ort_options({"provider": "cpu"}, model="m", default_provider="cuda")
    assert forced.provider == "cpu" and forced.precision == "fp32"


def test_precision_spellings() -> None:
    assert parse_ort_options({"precision": "F32"}, model="m").precision == "fp32"
    assert parse_ort_options({"precision": "bfloat16", "provider": "cuda"}).precision == "bf16"


@pytest.mark.parametrize(
    ("options", "key"),
    [
        ({"precision": "fp16"}, "models.m.options.precision"),  # no fp16 on the CPU
        ({"paged_attention": True}, "models.m.options.paged_attention"),
        ({"provider": "rocm"}, "models.m.options.provider"),
        ({"max_batch_size": 0}, "models.m.options.max_batch_size"),
        ({"nope": 1}, "models.m.options.nope"),
    ],
)
def test_bad_options_name_the_key(options: dict[str, object], key: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_ort_options(options, model="m", default_provider="cpu")
    assert [k for k, _ in err.value.errors] == [key]
    assert key in str(err.value)


def test_engine_choice(tmp_path: Path) -> None:
    geometry = {"num_hidden_layers": 2, "num_attention_heads": 2, "hidden_size": 8}
    (tmp_path / "config.json").write_text(json.dumps(geometry))
    factory = engine_factory("cpu", torch_device=CpuDevice, ort_provider="cpu")
    ort = factory(ModelConfig(name="m", path=tmp_path, options={"engine": "onnxruntime"}))
    assert type(ort).__name__ == "OnnxRuntimeEngine" and ort.backend == "cpu"
    torch = factory(ModelConfig(name="m", path=tmp_path, options={"engine": "torch"}))
    assert type(torch).__name__ == "TorchEngine"
    with pytest.raises(ConfigError) as err:
        factory(ModelConfig(name="m", path=tmp_path, options={"engine": "tensorrt"}))
    assert err.value.errors[0][0] == "models.m.options.engine"
    assert "torch, onnxruntime" in str(err.value)
    torch_only = engine_factory("rocm", torch_device=CpuDevice)
    with pytest.raises(ConfigError, match="backend 'rocm' has no engine 'onnxruntime'"):
        torch_only(ModelConfig(name="m", path=tmp_path, options={"engine": "onnxruntime"}))
