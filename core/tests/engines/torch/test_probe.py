"""Tests of servehall.engines.torch.probe: reading the torch build and counting driver
devices without importing torch.

The driver-count cases load fake driver libraries (``libcuda.so.1``, ``libamdhip64.so``)
compiled here from a few lines of C — no NVIDIA or AMD hardware exists on this machine —
in one child process whose ``LD_LIBRARY_PATH`` finds them, next to a fake ``torch`` package
that has only a CUDA build's ``version.py``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import servehall
from servehall.engines.torch.probe import DriverCount, _field, driver_device_count, torch_build

FAKE_DRIVERS_C = r"""
#include <stdlib.h>
static int env(const char *name) { const char *v = getenv(name); return v ? atoi(v) : 0; }
int cuInit(unsigned flags) { return env("FAKE_CUINIT_RC"); }
int cuDeviceGetCount(int *count) { *count = env("FAKE_CUDA_COUNT"); return env("FAKE_COUNT_RC"); }
int hipGetDeviceCount(int *count) { *count = env("FAKE_HIP_COUNT"); return env("FAKE_COUNT_RC"); }
"""

CHILD = r"""
import json, os
from servehall.engines.torch.probe import driver_device_count, torch_build

def count(kind, **env):
    os.environ.update({k: str(v) for k, v in env.items()})
    got = driver_device_count(kind)
    return [got.count, got.reason]

b = torch_build()
print(json.dumps({
    "build": [b.installed, b.version, b.cuda, b.hip],
    "cuda_ok": count("cuda", FAKE_CUINIT_RC=0, FAKE_CUDA_COUNT=3, FAKE_COUNT_RC=0),
    "cuda_init_fails": count("cuda", FAKE_CUINIT_RC=100),
    "cuda_count_fails": count("cuda", FAKE_CUINIT_RC=0, FAKE_COUNT_RC=2),
    "hip_ok": count("hip", FAKE_HIP_COUNT=2, FAKE_COUNT_RC=0),
    "hip_fails": count("hip", FAKE_COUNT_RC=101),
}))
"""

FAKE_TORCH_VERSION = """\
from typing import Optional

__all__ = ['__version__', 'cuda', 'hip']
__version__ = '2.9.1+cu128'
debug = False
cuda: Optional[str] = '12.8'
git_version = 'abc'
hip: Optional[str] = None
"""


@pytest.fixture(scope="module")
def child(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Run the probes in a child process with fake drivers and a fake CUDA torch build."""
    if shutil.which("cc") is None:
        pytest.skip("no C compiler to build the fake driver libraries")
    root = tmp_path_factory.mktemp("fake-drivers")
    src = root / "fake.c"
    src.write_text(FAKE_DRIVERS_C)
    for name in ("libcuda.so.1", "libamdhip64.so"):
        subprocess.run(
            ["cc", "-shared", "-fPIC", "-o", str(root / name), str(src)], check=True, timeout=60
        )
    site = root / "site"
    (site / "torch").mkdir(parents=True)
    (site / "torch" / "__init__.py").write_text("raise ImportError('a probe imported torch')\n")
    (site / "torch" / "version.py").write_text(FAKE_TORCH_VERSION)
    core_src = str(Path(servehall.__file__).parent.parent)
    env = {
        **os.environ,
        "LD_LIBRARY_PATH": str(root),
        "PYTHONPATH": os.pathsep.join([str(site), core_src]),
    }
    out = subprocess.run(
        [sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    result: dict[str, Any] = json.loads(out.stdout)
    return result


def test_torch_build_reads_a_cuda_build_without_importing_it(child: dict[str, Any]) -> None:
    assert child["build"] == [True, "2.9.1+cu128", "12.8", None]


def test_cuda_driver_count(child: dict[str, Any]) -> None:
    assert child["cuda_ok"] == [3, "3 CUDA device(s) visible"]
    assert child["cuda_init_fails"] == [0, "cuInit failed with CUDA error 100"]
    assert child["cuda_count_fails"] == [0, "cuDeviceGetCount failed with CUDA error 2"]


def test_hip_driver_count(child: dict[str, Any]) -> None:
    assert child["hip_ok"] == [2, "2 ROCm device(s) visible"]
    assert child["hip_fails"] == [0, "hipGetDeviceCount failed with HIP error 101"]


def test_no_driver_and_unknown_kind_never_raise() -> None:
    if os.path.exists("/dev/nvidia0") or os.path.exists("/dev/kfd"):
        pytest.skip("a real GPU driver may be present")
    assert driver_device_count("cuda") == DriverCount(
        0, "no NVIDIA driver (libcuda.so.1 not found)"
    )
    assert driver_device_count("hip") == DriverCount(
        0, "no ROCm runtime (libamdhip64.so not found)"
    )
    assert driver_device_count("tpu") == DriverCount(0, "unknown driver kind 'tpu'")


def test_torch_build_of_the_installed_torch_matches_its_version() -> None:
    build = torch_build()
    try:
        import torch
    except ImportError:
        assert build.installed is False
        return
    assert build.installed and build.version == torch.__version__
    assert build.cuda == torch.version.cuda and build.hip == torch.version.hip


@pytest.mark.parametrize(
    ("text", "name", "value"),
    [
        ("__version__ = '2.1.0'\n", "__version__", "2.1.0"),
        ('cuda: Optional[str] = "12.1"\n', "cuda", "12.1"),
        ("cuda: Optional[str] = None\n", "cuda", None),
        ("hip = ''\n", "hip", ""),
        ("hipx = '6.0'\n", "hip", None),
        ("  hip = '6.0'\n", "hip", None),  # only top-level assignments
        ("x = 1\nhip = '6.1.2'\n", "hip", "6.1.2"),
    ],
)
def test_field_parsing(text: str, name: str, value: str | None) -> None:
    assert _field(text, name) == value
