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
    VllmBuild,
    cuda_provider_status,
    driver_device_count,
    torch_build,
    vllm_status,
)


def probe_cuda(
    build: TorchBuild | None = None,
    devices: DriverCount | None = None,
    ort_versions: dict[str, str | None] | None = None,
    vllm: VllmBuild | None = None,
) -> ProbeResult:
    """Available when one of the backend's engines can run on a GPU here.

    The vLLM engine needs vLLM's CUDA build and a visible GPU (:func:`probe_vllm_cuda`);
    the torch engine a CUDA build of torch and a visible GPU (:func:`probe_torch_cuda`);
    the ONNX Runtime engine a CUDA build of ONNX Runtime GenAI and a visible GPU
    (:func:`servehall.devices.cuda_provider_status`). The reason names all three.
    ``build``/``devices``/``ort_versions``/``vllm`` default to the real machine; tests
    pass fakes.
    """
    devices = devices if devices is not None else driver_device_count("cuda")
    torch_result = probe_torch_cuda(build, devices)
    ort = cuda_provider_status(ort_versions, devices)
    vllm_result = probe_vllm_cuda(devices, vllm)
    return ProbeResult(
        torch_result.available or ort.available or vllm_result.available,
        f"engine vllm: {vllm_result.reason}; engine torch: {torch_result.reason}; "
        f"engine onnxruntime: {ort.reason}",
    )


def probe_vllm_cuda(
    devices: DriverCount | None = None, vllm: VllmBuild | None = None
) -> ProbeResult:
    """Available when vLLM's CUDA build is installed and the driver sees a GPU."""
    devices = devices if devices is not None else driver_device_count("cuda")
    return vllm_status("cuda", ProbeResult(devices.count >= 1, devices.reason), vllm)


def default_engine() -> str:
    """``vllm`` where vLLM's CUDA build is installed and a GPU is visible, else ``torch``."""
    return "vllm" if probe_vllm_cuda().available else "torch"


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
