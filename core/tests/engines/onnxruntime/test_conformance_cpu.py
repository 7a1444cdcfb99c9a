"""The backend conformance suite on the ONNX Runtime GenAI engine, CPU execution provider.

Backend ``cpu`` with ``options.engine = "onnxruntime"``: the very engine the ``cuda``
plugin runs on the CUDA execution provider, here on the CPU one. The tiny random Llama is
built into an ONNX GenAI model once per session (model builder, fp32).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import pytest

from servehall.config.models import ModelConfig
from servehall.testing.conformance import EngineFactory, TinyLlamaConformance

pytest.importorskip("onnxruntime_genai")
pytest.importorskip("torch")


class TestOnnxRuntimeCpuConformance(TinyLlamaConformance):
    backend = "cpu"
    model_options: ClassVar[dict[str, Any]] = {"engine": "onnxruntime", "max_batch_size": 8}

    @pytest.fixture
    def conformance_engine_factory(
        self, servehall_tiny_llama: Path, ort_cache_dir: Path
    ) -> EngineFactory:
        model = ModelConfig(
            name="tiny",
            path=servehall_tiny_llama,
            backend=self.backend,
            max_model_len=self.max_model_len,
            options={**self.model_options, "cache_dir": str(ort_cache_dir)},
        )
        spec = self.backend_spec(self.backend)
        return lambda: spec.factory(model)

    @pytest.fixture
    def conformance_worker_model(
        self, servehall_tiny_llama: Path, ort_cache_dir: Path
    ) -> tuple[tuple[str, ...], ModelConfig]:
        model = ModelConfig(
            name="tiny",
            path=servehall_tiny_llama,
            backend=self.backend,
            max_model_len=self.max_model_len,
            options={**self.model_options, "cache_dir": str(ort_cache_dir)},
        )
        return tuple(self.plugins), model

    @pytest.fixture
    def conformance_crash(self) -> Any:
        return lambda engine: engine._inject_fault("simulated device fault")
