"""Entry module of the ``rocm`` plugin (import-light: torch loads only when selected)."""

from __future__ import annotations

from servehall import BackendRegistry, BackendSpec, hookimpl
from servehall.devices import engine_factory
from servehall_rocm.device import RocmDevice
from servehall_rocm.probe import default_engine, probe_rocm_engines

SERVEHALL_HOOK_API = "2"

ROCM_AUTO_PRIORITY = 300
"""Same rank as ``cuda``: a torch build is either CUDA or ROCm, never both."""


@hookimpl
def servehall_register_backends(registry: BackendRegistry) -> None:
    registry.add(
        BackendSpec(
            "rocm",
            probe_rocm_engines,
            engine_factory(
                "rocm", torch_device=RocmDevice, vllm=True, default_engine=default_engine
            ),
            auto_priority=ROCM_AUTO_PRIORITY,
            description=(
                "AMD GPUs: vLLM's ROCm build (options.engine = 'vllm', the default where "
                "installed) or torch + transformers continuous batching ('torch')"
            ),
        )
    )
