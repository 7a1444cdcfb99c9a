"""Entry module of the ``rocm`` plugin (import-light: torch loads only when selected)."""

from __future__ import annotations

from servehall import BackendRegistry, BackendSpec, hookimpl
from servehall.devices import torch_engine_factory
from servehall_rocm.device import RocmDevice
from servehall_rocm.probe import probe_rocm

SERVEHALL_HOOK_API = "2"

ROCM_AUTO_PRIORITY = 300
"""Same rank as ``cuda``: a torch build is either CUDA or ROCm, never both."""


@hookimpl
def servehall_register_backends(registry: BackendRegistry) -> None:
    registry.add(
        BackendSpec(
            "rocm",
            probe_rocm,
            torch_engine_factory(RocmDevice, "rocm"),
            auto_priority=ROCM_AUTO_PRIORITY,
            description="AMD GPUs (ROCm/HIP torch): torch + transformers continuous batching",
        )
    )
