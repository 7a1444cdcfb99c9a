"""Entry module of the ``ascend`` plugin (import-light; see :mod:`.guard` for why it may set
``TORCH_DEVICE_BACKEND_AUTOLOAD=0`` on import).

Backends:

* ``ascend`` — an Ascend NPU via ``torch_npu`` (``auto`` rank 200: below GPUs, above CPUs);
* ``ascend-simulated`` — the same adapter on a simulated NPU backed by the host CPU, for
  the conformance kit; excluded from ``auto`` (``auto_priority=None``) and therefore only
  used when a config names it.
"""

from __future__ import annotations

from servehall import BackendRegistry, BackendSpec, ProbeResult, hookimpl
from servehall.devices import engine_factory, torch_engine_factory
from servehall_ascend_stub.device import NpuDevice, SimulatedNpuDevice
from servehall_ascend_stub.guard import protect_torch_import
from servehall_ascend_stub.probe import default_engine, probe_ascend_engines

SERVEHALL_HOOK_API = "2"

ASCEND_AUTO_PRIORITY = 200

protect_torch_import()


def probe_simulated() -> ProbeResult:
    """Always available: the simulation needs only torch on the host CPU."""
    return ProbeResult(True, "simulated NPU on the host CPU (tests only; never chosen by auto)")


@hookimpl
def servehall_register_backends(registry: BackendRegistry) -> None:
    registry.add(
        BackendSpec(
            "ascend",
            probe_ascend_engines,
            engine_factory(
                "ascend", torch_device=NpuDevice, vllm=True, default_engine=default_engine
            ),
            auto_priority=ASCEND_AUTO_PRIORITY,
            description=(
                "Ascend NPUs: vLLM on the vllm-ascend platform (options.engine = 'vllm', "
                "the default where installed) or torch + transformers on torch_npu ('torch')"
            ),
        )
    )
    registry.add(
        BackendSpec(
            "ascend-simulated",
            probe_simulated,
            torch_engine_factory(SimulatedNpuDevice, "ascend-simulated"),
            auto_priority=None,
            description="the ascend adapter on a simulated NPU (host CPU) for conformance tests",
        )
    )
