"""Probe for backend ``cuda``: a CUDA (not ROCm) build of torch and a visible NVIDIA GPU.

Import-light: reads ``torch/version.py`` and asks the driver (``libcuda``) for the device
count; torch is not imported (see :func:`servehall.devices.torch_build`).
"""

from __future__ import annotations

import os

from servehall import ProbeResult
from servehall.devices import (
    DriverCount,
    TorchBuild,
    cuda_provider_status,
    driver_device_count,
    torch_build,
)


def probe_cuda(
    build: TorchBuild | None = None,
    devices: DriverCount | None = None,
    ort_versions: dict[str, str | None] | None = None,
) -> ProbeResult:
    """Available when one of the backend's engines can run on a GPU here.

    The torch engine needs a CUDA build of torch and a visible GPU
    (:func:`probe_torch_cuda`); the ONNX Runtime engine needs a CUDA build of ONNX Runtime
    GenAI and a visible GPU (:func:`servehall.devices.cuda_provider_status`).
    The reason names both. ``build``/``devices``/``ort_versions`` default to the real
    machine; tests pass fakes.
    """
    torch_result = probe_torch_cuda(build, devices)
    ort = cuda_provider_status(ort_versions, devices)
    return ProbeResult(
        torch_result.available or ort.available,
        f"{torch_result.reason}; engine onnxruntime: {ort.reason}",
    )


def probe_torch_cuda(
    build: TorchBuild | None = None, devices: DriverCount | None = None
) -> ProbeResult:
    """Available when torch is a CUDA build and the driver sees at least one GPU."""
    build = build if build is not None else torch_build()
    if not build.installed:
        return ProbeResult(False, "torch is not installed (install a CUDA build of torch)")
    if build.hip is not None:
        return ProbeResult(
            False, f"torch {build.version} is a ROCm build (torch.version.hip={build.hip})"
        )
    if build.cuda is None:
        return ProbeResult(
            False,
            f"torch.cuda.is_available() is False: torch {build.version} is a CPU-only build "
            "(torch.version.cuda is None)",
        )
    devices = devices if devices is not None else driver_device_count("cuda")
    if devices.count < 1:
        env = os.environ.get("CUDA_VISIBLE_DEVICES")
        hint = f"; CUDA_VISIBLE_DEVICES={env!r}" if env is not None else ""
        return ProbeResult(False, f"torch.cuda.is_available() is False: {devices.reason}{hint}")
    return ProbeResult(True, f"torch {build.version} (CUDA {build.cuda}); {devices.reason}")
