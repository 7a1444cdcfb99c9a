"""Probe for backend ``rocm``: torch's ROCm build (``torch.version.hip``) and a visible GPU.

Import-light: reads ``torch/version.py`` and asks the HIP runtime (``libamdhip64``) for the
device count; torch is not imported.
"""

from __future__ import annotations

import os

from servehall import ProbeResult
from servehall.devices import (
    DriverCount,
    TorchBuild,
    VllmBuild,
    driver_device_count,
    torch_build,
    vllm_status,
)

VISIBLE_ENVS = ("HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES")


def probe_rocm(build: TorchBuild | None = None, devices: DriverCount | None = None) -> ProbeResult:
    """Available when torch is a ROCm build and HIP sees at least one GPU.

    ``build``/``devices`` default to the real machine; tests pass fakes.
    """
    build = build if build is not None else torch_build()
    if not build.installed:
        return ProbeResult(False, "torch is not installed (install a ROCm build of torch)")
    if build.hip is None:
        kind = f"a CUDA {build.cuda} build" if build.cuda else "a CPU-only build"
        return ProbeResult(
            False, f"torch {build.version} is {kind}, not a ROCm build (torch.version.hip is None)"
        )
    devices = devices if devices is not None else driver_device_count("hip")
    if devices.count < 1:
        hints = [f"{e}={os.environ[e]!r}" for e in VISIBLE_ENVS if e in os.environ]
        return ProbeResult(
            False,
            f"no ROCm GPU visible: {devices.reason}" + (f" ({', '.join(hints)})" if hints else ""),
        )
    return ProbeResult(True, f"torch {build.version} (HIP {build.hip}); {devices.reason}")


def probe_vllm_rocm(
    devices: DriverCount | None = None, vllm: VllmBuild | None = None
) -> ProbeResult:
    """Available when a ROCm build of vLLM is installed and the driver sees a GPU."""
    devices = devices if devices is not None else driver_device_count("hip")
    return vllm_status("rocm", ProbeResult(devices.count >= 1, devices.reason), vllm)


def probe_rocm_engines(
    build: TorchBuild | None = None,
    devices: DriverCount | None = None,
    vllm: VllmBuild | None = None,
) -> ProbeResult:
    """The backend's probe: available when the torch engine (:func:`probe_rocm`) or the
    vLLM engine (:func:`probe_vllm_rocm`) can run; the reason names both."""
    devices = devices if devices is not None else driver_device_count("hip")
    torch_result = probe_rocm(build, devices)
    vllm_result = probe_vllm_rocm(devices, vllm)
    return ProbeResult(
        torch_result.available or vllm_result.available,
        f"engine vllm: {vllm_result.reason}; engine torch: {torch_result.reason}",
    )


def default_engine() -> str:
    """``vllm`` where a ROCm build of vLLM is installed and a GPU is visible, else ``torch``."""
    return "vllm" if probe_vllm_rocm().available else "torch"
