"""Default plugin: backend ``cpu`` — the shared torch engine on the host CPU (or
``options.engine = "onnxruntime"`` / ``"vllm"``, the latter on vLLM's CPU build).

It is the reference backend for parity tests. Available whenever torch and transformers
import (extra ``servehall[torch]``); the probe checks with ``importlib.util.find_spec``
only, so listing backends never imports torch. ``auto_priority`` 10: the last resort of
``backend = "auto"`` (accelerators use >= 100, optimized CPU backends sit in between).
"""

from __future__ import annotations

import importlib.util

from servehall.engines.backends import BackendRegistry, BackendSpec, ProbeResult
from servehall.engines.onnxruntime.probe import cpu_provider_status
from servehall.engines.select import engine_factory
from servehall.engines.torch import CpuDevice
from servehall.engines.vllm.probe import vllm_build
from servehall.plugin.hookimpl import hookimpl

CPU_AUTO_PRIORITY = 10


def probe_cpu() -> ProbeResult:
    """Available when torch and transformers are installed (no import)."""
    missing = [m for m in ("torch", "transformers") if importlib.util.find_spec(m) is None]
    if missing:
        return ProbeResult(
            False, f"{', '.join(missing)} not installed (pip install 'servehall[torch]')"
        )
    ort = cpu_provider_status()
    vllm = vllm_build()
    return ProbeResult(
        True,
        f"torch on the host CPU; engine onnxruntime: {ort.reason}; engine vllm: {vllm.describe()}",
    )


def _fp32() -> str:
    """``dtype = "auto"`` of the vLLM engine on ``cpu``: float32, as the torch engine (the
    parity reference); ``dtype = "bf16"`` opts into vLLM's faster bfloat16 CPU kernels."""
    return "float32"


@hookimpl
def servehall_register_backends(registry: BackendRegistry) -> None:
    registry.add(
        BackendSpec(
            "cpu",
            probe_cpu,
            engine_factory(
                "cpu", torch_device=CpuDevice, ort_provider="cpu", vllm=True, vllm_dtype=_fp32
            ),
            auto_priority=CPU_AUTO_PRIORITY,
            description=(
                "torch + transformers continuous batching on the host CPU (reference); "
                "options.engine = 'onnxruntime' for ONNX Runtime GenAI, 'vllm' for vLLM's "
                "CPU build"
            ),
        )
    )
