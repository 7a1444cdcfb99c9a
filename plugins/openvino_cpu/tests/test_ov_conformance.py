"""The core's backend conformance kit, run against openvino_cpu on the converted demo model."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from servehall import BackendSpec, ModelConfig
from servehall.testing.conformance import BackendConformance
from servehall_openvino_cpu import plugin
from servehall_openvino_cpu.engine import OpenVINOEngine


class TestOpenVINOCpuConformance(BackendConformance):
    timeout_s = 120.0

    @pytest.fixture
    def conformance_engine_factory(
        self, ov_model: Callable[..., ModelConfig]
    ) -> Callable[[], OpenVINOEngine]:
        model = ov_model()
        return lambda: plugin.factory(model)

    @pytest.fixture
    def conformance_worker_model(
        self, ov_model: Callable[..., ModelConfig]
    ) -> tuple[tuple[str, ...], ModelConfig]:
        return ("openvino_cpu",), ov_model()

    @pytest.fixture
    def conformance_backend_spec(self) -> BackendSpec:
        return plugin.SPEC

    @pytest.fixture
    def conformance_crash(self) -> Callable[[Any], None]:
        return lambda engine: engine._inject_fault("simulated step failure")
