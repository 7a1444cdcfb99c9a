"""Tests of servehall.engines.onnxruntime.probe: which ONNX Runtime (GenAI) builds are
installed, and whether the CPU / CUDA execution providers are offered (never a GPU without
a CUDA build *and* a visible device). Installed builds are faked with real dist-info
metadata on a temporary ``sys.path`` entry; device counts with ``DriverCount`` values."""

from __future__ import annotations

from pathlib import Path

import pytest

from servehall.engines.onnxruntime.probe import (
    GENAI_DISTS,
    RUNTIME_DISTS,
    cpu_provider_status,
    cuda_provider_status,
    describe_builds,
    onnxruntime_builds,
)
from servehall.engines.torch.probe import DriverCount

CPU_ONLY = {"onnxruntime-genai": "0.18.0", "onnxruntime": "1.32.0"}
CUDA_BUILD = {"onnxruntime-genai-cuda": "0.18.0", "onnxruntime-gpu": "1.32.0"}


def _install_dists(site: Path, dists: dict[str, str], package: str | None) -> None:
    """Write ``.dist-info`` metadata for ``dists`` (name → version), as pip would, and an
    empty ``package`` to import, under ``site`` (a ``sys.path`` entry)."""
    for name, version in dists.items():
        info = site / f"{name.replace('-', '_')}-{version}.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    if package is not None:
        (site / package).mkdir(parents=True, exist_ok=True)
        (site / package / "__init__.py").write_text("raise ImportError('a probe imported me')\n")


def test_probe_never_claims_a_gpu_without_one() -> None:
    none = cuda_provider_status({"onnxruntime-genai": None}, DriverCount(1, "1 visible"))
    assert not none.available and "not installed" in none.reason
    cpu_build = cuda_provider_status(CPU_ONLY, DriverCount(1, "1 visible"))
    assert not cpu_build.available
    assert "no CUDA execution provider" in cpu_build.reason and "CPU build" in cpu_build.reason
    no_gpu = cuda_provider_status(CUDA_BUILD, DriverCount(0, "no NVIDIA driver"))
    assert not no_gpu.available
    assert "no NVIDIA driver" in no_gpu.reason and "fall back" in no_gpu.reason
    ok = cuda_provider_status(CUDA_BUILD, DriverCount(2, "2 CUDA device(s) visible"))
    assert ok.available and "CUDA build" in ok.reason and "2 CUDA device(s)" in ok.reason


def test_cpu_provider_status() -> None:
    assert cpu_provider_status(CPU_ONLY).available
    missing = cpu_provider_status({"onnxruntime-genai": None})
    assert not missing.available and "pip install 'servehall[onnxruntime]'" in missing.reason


def test_describe_builds() -> None:
    assert describe_builds(CPU_ONLY) == "onnxruntime-genai 0.18.0, onnxruntime 1.32.0 (CPU build)"
    assert describe_builds(CUDA_BUILD) == (
        "onnxruntime-genai-cuda 0.18.0, onnxruntime-gpu 1.32.0 (CUDA build)"
    )
    # the runtime alone is not enough
    assert describe_builds({"onnxruntime": "1.32.0", "onnxruntime-genai": None}) == (
        "onnxruntime-genai not installed (pip install 'servehall[onnxruntime]')"
    )
    assert not cpu_provider_status({"onnxruntime": "1.32.0"}).available


def test_a_cuda_build_also_offers_the_cpu_provider() -> None:
    assert cpu_provider_status(CUDA_BUILD).available


def test_onnxruntime_builds_reads_installed_metadata(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _install_dists(tmp_path, {"onnxruntime-genai-cuda": "9.9.1", "onnxruntime-gpu": "9.8.0"}, None)
    monkeypatch.syspath_prepend(str(tmp_path))
    builds = onnxruntime_builds()
    assert list(builds) == [*GENAI_DISTS, *RUNTIME_DISTS]
    assert builds["onnxruntime-genai-cuda"] == "9.9.1" and builds["onnxruntime-gpu"] == "9.8.0"
    # the CUDA provider then depends on the device count only
    assert cuda_provider_status(devices=DriverCount(1, "1 CUDA device(s) visible")).available
    assert not cuda_provider_status(devices=DriverCount(0, "no NVIDIA driver")).available
