"""Tests of servehall.engines.onnxruntime.build: the ONNX Runtime GenAI model builder's
command line, the build cache key, and resolving a model directory to an ONNX GenAI one
(as is, refused, or built once into the cache)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from servehall.engines.onnxruntime import (
    is_onnx_genai_dir,
    parse_ort_options,
    resolve_onnx_dir,
)
from servehall.engines.onnxruntime.build import build_key, builder_args, default_cache_dir
from servehall.errors import ConfigError, EngineError


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


def test_default_cache_dir_follows_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SERVEHALL_CACHE_DIR", str(tmp_path))
    assert default_cache_dir() == tmp_path / "onnxruntime"


def test_a_genai_config_that_is_not_a_file_does_not_count(tmp_path: Path) -> None:
    (tmp_path / "genai_config.json").mkdir()
    assert not is_onnx_genai_dir(tmp_path)


def test_builder_command_line(tmp_path: Path) -> None:
    opts = parse_ort_options({"precision": "int4"}, model="m")
    args = builder_args(tmp_path / "src", tmp_path / "out", opts)
    assert args[1:3] == ["-m", "onnxruntime_genai.models.builder"]
    pairs = dict(zip(args[3:-2:2], args[4:-2:2], strict=True))
    assert pairs == {
        "-i": str(tmp_path / "src"),
        "-o": str(tmp_path / "out"),
        "-p": "int4",
        "-e": "cpu",
        "-c": str(tmp_path / "out" / ".hf-cache"),
    }
    assert args[-2:] == ["--extra_options", f"max_batch_size={opts.max_batch_size}"]
    # the key follows the precision too
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "config.json").write_text("{}")
    assert build_key(tmp_path / "src", opts) != build_key(
        tmp_path / "src", parse_ort_options({}, model="m")
    )
