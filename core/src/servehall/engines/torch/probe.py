"""Import-light probing helpers for torch device plugins.

Probes run when ``servehall plugins`` lists backends and when ``backend = "auto"`` is
resolved, so they must not import torch (seconds, and with a broken vendor extension it
can even fail). These helpers answer from files and the driver library instead:

* :func:`torch_build` reads ``torch/version.py`` (``cuda``/``hip`` build strings) without
  importing the ``torch`` package;
* :func:`driver_device_count` asks a driver library through ``ctypes`` how many devices
  are visible (``cuDeviceGetCount`` for CUDA, ``hipGetDeviceCount`` for ROCm); the
  ``*_VISIBLE_DEVICES`` variables are honoured by the driver itself.
"""

from __future__ import annotations

import ctypes
import importlib.util
import re
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class TorchBuild:
    """What torch build is installed (``None`` fields: not installed / not that build)."""

    installed: bool
    version: str | None = None
    cuda: str | None = None
    hip: str | None = None


def _field(text: str, name: str) -> str | None:
    m = re.search(rf"^{name}\s*(?::[^=]*)?=\s*(.+)$", text, re.MULTILINE)
    if not m:
        return None
    value = m.group(1).strip()
    if value in ("None", ""):
        return None
    return value.strip("'\"")


def torch_build() -> TorchBuild:
    """Read ``torch/version.py`` of the installed torch (never imports torch)."""
    try:
        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        return TorchBuild(False)
    for location in spec.submodule_search_locations:
        path = Path(location) / "version.py"
        try:
            text = path.read_text()
        except OSError:
            continue
        return TorchBuild(
            True,
            version=_field(text, "__version__"),
            cuda=_field(text, "cuda"),
            hip=_field(text, "hip"),
        )
    return TorchBuild(True)


@dataclass(frozen=True, slots=True)
class DriverCount:
    """Devices visible through a driver library, or why none could be counted."""

    count: int
    reason: str


def _load(names: tuple[str, ...]) -> ctypes.CDLL | None:
    for name in names:
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    return None


def driver_device_count(kind: str) -> DriverCount:
    """Count visible ``"cuda"`` or ``"hip"`` devices through the driver (never raises)."""
    try:
        if kind == "cuda":
            lib = _load(("libcuda.so.1", "libcuda.so", "nvcuda.dll"))
            if lib is None:
                return DriverCount(0, "no NVIDIA driver (libcuda.so.1 not found)")
            rc = lib.cuInit(0)
            if rc != 0:
                return DriverCount(0, f"cuInit failed with CUDA error {rc}")
            count = ctypes.c_int(0)
            rc = lib.cuDeviceGetCount(ctypes.byref(count))
            if rc != 0:
                return DriverCount(0, f"cuDeviceGetCount failed with CUDA error {rc}")
            return DriverCount(count.value, f"{count.value} CUDA device(s) visible")
        if kind == "hip":
            lib = _load(("libamdhip64.so", "libamdhip64.so.6", "libamdhip64.so.5"))
            if lib is None:
                return DriverCount(0, "no ROCm runtime (libamdhip64.so not found)")
            count = ctypes.c_int(0)
            rc = lib.hipGetDeviceCount(ctypes.byref(count))
            if rc != 0:
                return DriverCount(0, f"hipGetDeviceCount failed with HIP error {rc}")
            return DriverCount(count.value, f"{count.value} ROCm device(s) visible")
    except Exception as exc:  # a probe never raises
        return DriverCount(0, f"driver query failed: {type(exc).__name__}: {exc}")
    return DriverCount(0, f"unknown driver kind {kind!r}")
