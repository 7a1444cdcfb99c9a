"""Import-light availability probe of the ``openvino_cpu`` backend.

Runs when ``servehall plugins`` lists backends and when ``backend = "auto"`` resolves, so
it never imports OpenVINO (a second or more): it looks the packages up with
``importlib.util.find_spec``, reads their versions from distribution metadata, and checks
the CPU: an x86-64 machine with at least SSE4.2 (OpenVINO's CPU plugin minimum; AVX2 or
AVX-512 for useful speed). ``avx512_bf16``/``amx_bf16`` mean ``inference_precision =
"bf16"`` runs natively. :func:`open_model` checks a ``[[models]]`` entry against it.
"""

from __future__ import annotations

import importlib.util
import platform
from importlib import metadata
from pathlib import Path

from servehall import ConfigError, HfModelFacts, ModelConfig, ProbeResult
from servehall_openvino_cpu.convert import EXPORTER_INSTALL, exporter_installed
from servehall_openvino_cpu.options import OpenVINOOptions, parse_options

REQUIRED = ("openvino", "openvino_genai")
"""Modules the engine needs at run time (``openvino_tokenizers`` only for conversion)."""

X86_MACHINES = frozenset({"x86_64", "amd64", "x64", "i686", "i386"})


def cpu_flags() -> frozenset[str]:
    """CPU feature flags from ``/proc/cpuinfo`` (empty where it cannot be read)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        if line.startswith("flags"):
            return frozenset(line.partition(":")[2].split())
    return frozenset()


def bf16_native(flags: frozenset[str] | None = None) -> bool:
    """True when the CPU computes bf16 natively (AVX-512 BF16 or AMX-BF16)."""
    flags = cpu_flags() if flags is None else flags
    return bool({"avx512_bf16", "amx_bf16"} & flags)


def open_model(model: ModelConfig) -> tuple[Path, OpenVINOOptions, HfModelFacts]:
    """What both ``openvino_cpu`` engines check of a ``[[models]]`` entry before OpenVINO
    is imported: its options, bf16 against this CPU, its directory and
    ``config.json`` facts.

    Returns:
        the model directory (``~`` expanded), the validated options, the directory's facts.

    Raises:
        ConfigError: invalid options, ``inference_precision = "bf16"`` on a CPU without
            native bf16, ``path`` not a directory, an unreadable ``config.json``.
    """
    path = Path(model.path).expanduser()
    options = parse_options(model.options, model=model.name)
    if options.inference_precision == "bf16" and not bf16_native():
        raise ConfigError(
            f"model {model.name!r}: inference_precision 'bf16' needs a CPU with "
            "AVX-512 BF16 or AMX (not found in /proc/cpuinfo); use 'f32'"
        )
    if not path.is_dir():
        raise ConfigError(f"model {model.name!r}: {path} is not a directory")
    return path, options, HfModelFacts.read(path)


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "?"


def probe() -> ProbeResult:
    """Whether OpenVINO GenAI can run on this CPU, with the reason (never raises)."""
    machine = platform.machine().lower()
    if machine not in X86_MACHINES:
        return ProbeResult(False, f"CPU architecture {machine or 'unknown'} is not x86-64")
    missing = []
    for mod in REQUIRED:
        try:
            found = importlib.util.find_spec(mod) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            missing.append(mod)
    if missing:
        dists = " ".join(m.replace("_", "-") for m in missing)
        return ProbeResult(False, f"{', '.join(missing)} not installed (pip install {dists})")
    flags = cpu_flags()
    if flags and "sse4_2" not in flags:
        return ProbeResult(False, "CPU lacks SSE4.2, the OpenVINO CPU plugin's minimum")
    isa = next((n for f, n in (("avx512f", "AVX-512"), ("avx2", "AVX2")) if f in flags), None)
    isa = isa or ("SSE4.2" if flags else "ISA unknown")
    extra = ", native bf16" if bf16_native(flags) else ""
    reason = f"OpenVINO GenAI {_version('openvino-genai')} on x86-64 CPU ({isa}{extra})"
    if not exporter_installed():
        reason += (
            "; OpenVINO IR directories only: converting a Hugging Face directory needs "
            f"optimum-intel ({EXPORTER_INSTALL})"
        )
    return ProbeResult(True, reason)
