"""What ONNX Runtime GenAI can do on this machine, told without importing it.

``onnxruntime-gpu`` falls back to the CPU execution provider without a word when CUDA is
missing, so a GPU is never claimed from the package alone: the CUDA execution provider
counts as available only when a CUDA build of ONNX Runtime GenAI is installed
(``onnxruntime-genai-cuda``, which brings ``onnxruntime-gpu``) *and* the NVIDIA driver
reports at least one device (asked through ``libcuda``, as the torch probe does).
"""

from __future__ import annotations

from servehall.engines.backends import ProbeResult
from servehall.engines.cache import installed_versions
from servehall.engines.torch.probe import DriverCount, driver_device_count

GENAI_DISTS = ("onnxruntime-genai", "onnxruntime-genai-cuda")
RUNTIME_DISTS = ("onnxruntime", "onnxruntime-gpu")


def onnxruntime_builds() -> dict[str, str | None]:
    """Installed versions of the ONNX Runtime (GenAI) distributions (None = missing)."""
    return installed_versions((*GENAI_DISTS, *RUNTIME_DISTS))


def describe_builds(versions: dict[str, str | None]) -> str:
    """One line naming the installed builds, e.g. ``onnxruntime-genai 0.18.0 (CPU build)``."""
    have = [f"{d} {v}" for d, v in versions.items() if v]
    if not versions.get("onnxruntime-genai") and not versions.get("onnxruntime-genai-cuda"):
        return "onnxruntime-genai not installed (pip install 'servehall[onnxruntime]')"
    kind = "CUDA build" if versions.get("onnxruntime-genai-cuda") else "CPU build"
    return f"{', '.join(have)} ({kind})"


def cpu_provider_status(versions: dict[str, str | None] | None = None) -> ProbeResult:
    """The CPU execution provider: available whenever ONNX Runtime GenAI is installed."""
    versions = versions if versions is not None else onnxruntime_builds()
    ok = bool(versions.get("onnxruntime-genai") or versions.get("onnxruntime-genai-cuda"))
    return ProbeResult(ok, describe_builds(versions))


def cuda_provider_status(
    versions: dict[str, str | None] | None = None, devices: DriverCount | None = None
) -> ProbeResult:
    """The CUDA execution provider: a CUDA build of ONNX Runtime GenAI and a visible GPU.

    ``versions``/``devices`` default to this machine; tests pass fakes.
    """
    versions = versions if versions is not None else onnxruntime_builds()
    if not versions.get("onnxruntime-genai-cuda"):
        return ProbeResult(
            False,
            f"no CUDA execution provider: {describe_builds(versions)}; "
            "install onnxruntime-genai-cuda (it brings onnxruntime-gpu)",
        )
    devices = devices if devices is not None else driver_device_count("cuda")
    if devices.count < 1:
        return ProbeResult(
            False,
            f"{describe_builds(versions)}, but {devices.reason}: ONNX Runtime would fall back "
            "to the CPU, so the CUDA execution provider is not offered",
        )
    return ProbeResult(True, f"{describe_builds(versions)}; {devices.reason}")
