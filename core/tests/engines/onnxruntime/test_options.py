"""ONNX Runtime engine: options, engine choice, probes and the model build cache."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from servehall.config.models import ModelConfig
from servehall.engines.onnxruntime import (
    is_onnx_genai_dir,
    parse_ort_options,
    resolve_onnx_dir,
)
from servehall.engines.onnxruntime.build import build_key, builder_args
from servehall.engines.select import engine_factory
from servehall.engines.torch import CpuDevice
from servehall.errors import ConfigError, EngineError

CPU_ONLY = {"onnxruntime-genai": "0.18.0", "onnxruntime": "1.32.0"}
CUDA_BUILD = {"onnxruntime-genai-cuda": "0.18.0", "onnxruntime-gpu": "1.32.0"}


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


def test_builder_args_and_key(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    opts = parse_ort_options({"max_batch_size": 4}, model="m")
    args = builder_args(tmp_path, tmp_path / "out", opts)
    assert args[-2:] == ["--extra_options", "max_batch_size=4"]
    assert args[args.index("-p") : args.index("-p") + 2] == ["-p", "fp32"]
    gpu = parse_ort_options({}, model="m", default_provider="cuda")
    assert "use_paged_attention=true" in builder_args(tmp_path, tmp_path / "o", gpu)
    key = build_key(tmp_path, opts)
    assert key == build_key(tmp_path, opts)
    assert key != build_key(tmp_path, parse_ort_options({"max_batch_size": 8}, model="m"))
    (tmp_path / "config.json").write_text('{"changed": 1}')
    assert key != build_key(tmp_path, opts)


def test_resolve_refuses_a_non_model_directory(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="neither an ONNX Runtime GenAI directory"):
        resolve_onnx_dir(tmp_path, parse_ort_options({}), quiet=True)


def test_resolve_uses_an_onnx_genai_directory_as_is(tmp_path: Path) -> None:
    (tmp_path / "genai_config.json").write_text(json.dumps({"model": {}}))
    assert is_onnx_genai_dir(tmp_path)
    assert resolve_onnx_dir(tmp_path, parse_ort_options({}), quiet=True) == tmp_path.resolve()


def test_builder_failure_is_one_engine_error_and_leaves_nothing(tmp_path: Path) -> None:
    pytest.importorskip("onnxruntime_genai")
    src = tmp_path / "weird"
    src.mkdir()
    (src / "config.json").write_text(json.dumps({"architectures": ["NoSuchForCausalLM"]}))
    cache = tmp_path / "cache"
    opts = parse_ort_options({"cache_dir": str(cache)})
    with pytest.raises(EngineError, match=r"building an ONNX Runtime GenAI model from .* failed"):
        resolve_onnx_dir(src, opts, quiet=True)
    assert [p.name for p in cache.iterdir() if not p.name.endswith(".lock")] == []


def test_build_is_cached_and_reused(servehall_tiny_llama: Path, ort_cache_dir: Path) -> None:
    pytest.importorskip("onnxruntime_genai")
    # the same options as the conformance suite: one build serves both
    opts = parse_ort_options({"cache_dir": str(ort_cache_dir), "max_batch_size": 8})
    first = resolve_onnx_dir(servehall_tiny_llama, opts, quiet=True)
    assert is_onnx_genai_dir(first) and (first / "servehall-onnx.json").is_file()
    assert first.parent == ort_cache_dir.resolve()
    assert not (first / ".hf-cache").exists()
    marker = json.loads((first / "servehall-onnx.json").read_text())
    assert marker["precision"] == "fp32" and marker["max_batch_size"] == 8
    mtime = (first / "genai_config.json").stat().st_mtime_ns
    assert resolve_onnx_dir(servehall_tiny_llama, opts, quiet=True) == first
    assert (first / "genai_config.json").stat().st_mtime_ns == mtime  # not rebuilt
