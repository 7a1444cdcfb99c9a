"""Entry module of the ``cuda`` plugin (import-light: torch loads only when selected)."""

from __future__ import annotations

from servehall import BackendRegistry, BackendSpec, hookimpl
from servehall.devices import engine_factory
from servehall_cuda.device import CudaDevice
from servehall_cuda.probe import default_engine, probe_cuda

SERVEHALL_HOOK_API = "2"

CUDA_AUTO_PRIORITY = 300
"""``auto`` preference: GPUs (cuda, rocm: 300) > NPUs (ascend: 200) > optimized CPU
backends (openvino_cpu) > ``cpu`` (10)."""


@hookimpl
def servehall_register_backends(registry: BackendRegistry) -> None:
    registry.add(
        BackendSpec(
            "cuda",
            probe_cuda,
            engine_factory(
                "cuda",
                torch_device=CudaDevice,
                ort_provider="cuda",
                vllm=True,
                default_engine=default_engine,
            ),
            auto_priority=CUDA_AUTO_PRIORITY,
            description=(
                "NVIDIA GPUs: vLLM (options.engine = 'vllm', the default where installed), "
                "torch + transformers continuous batching (the reference, 'torch'), or ONNX "
                "Runtime GenAI's CUDA execution provider ('onnxruntime')"
            ),
        )
    )
