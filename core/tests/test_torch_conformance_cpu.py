"""The backend conformance suite on the ``cpu`` torch backend (tiny random Llama)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from servehall import BackendSpec, ModelConfig
from servehall.plugins import PluginHost
from servehall.testing.conformance import BackendConformance

pytest.importorskip("torch")


def _cpu_spec() -> BackendSpec:
    return PluginHost().backends().get("cpu")


class TestCpuConformance(BackendConformance):
    @pytest.fixture
    def conformance_engine_factory(self, servehall_tiny_llama: Path) -> Any:
        model = ModelConfig(
            name="tiny",
            path=servehall_tiny_llama,
            backend="cpu",
            max_model_len=256,
            options={"kv_cache_blocks": 96, "block_size": 16, "max_batch_tokens": 128},
        )
        spec = _cpu_spec()
        return lambda: spec.factory(model)

    @pytest.fixture
    def conformance_backend_spec(self) -> BackendSpec:
        return _cpu_spec()

    @pytest.fixture
    def conformance_crash(self) -> Any:
        def crash(engine: Any) -> None:
            # a device fault in the middle of a step: the next forward pass raises
            def broken_forward(*args: Any, **kwargs: Any) -> Any:
                raise RuntimeError("simulated device fault")

            engine._model.forward = broken_forward

        return crash
