"""``BackendSpec.prepare_step`` and the build step of ``engine_factory``'s factories
(issue 26 item 4: a model is built before its worker's start window)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from servehall import BackendSpec, ConfigError, ProbeResult
from servehall.config.models import ModelConfig
from servehall.engines.select import engine_factory


def test_engine_choice_builds_the_onnx_model_before_the_worker_only_for_onnxruntime(
    tmp_path: Path,
) -> None:
    """``BackendSpec.prepare_step`` falls back to the factory's ``prepare``: the ONNX
    Runtime engine builds there (an ONNX GenAI directory is used as it is; a directory
    that is neither kind is the engine's ConfigError), the torch engine has nothing to
    build, and a worker under another interpreter builds in its own environment."""
    choice = engine_factory("cpu", torch_device=lambda: None, ort_provider="cpu")  # type: ignore[arg-type,return-value]
    spec = BackendSpec("cpu", lambda: ProbeResult(True), choice)
    step = spec.prepare_step()
    assert step is not None and step == choice.prepare
    assert (
        BackendSpec("x", lambda: ProbeResult(True), choice, prepare=print).prepare_step() is print
    )

    empty = tmp_path / "empty"
    empty.mkdir()
    onnx = ModelConfig(name="m", path=str(empty), backend="cpu", options={"engine": "onnxruntime"})
    with pytest.raises(ConfigError, match="neither an ONNX Runtime GenAI directory"):
        step(onnx)
    built = tmp_path / "built"
    built.mkdir()
    (built / "genai_config.json").write_text(
        '{"model": {"context_length": 64, "eos_token_id": 2, "vocab_size": 10}}'
    )
    step(onnx.model_copy(update={"path": str(built)}))  # already ONNX GenAI: nothing to do
    step(ModelConfig(name="t", path=str(empty), backend="cpu"))  # torch: nothing to build
    foreign = onnx.model_copy(
        update={"worker": onnx.worker.model_copy(update={"python": Path(sys.executable)})}
    )
    step(foreign)  # built by the worker, under its interpreter
