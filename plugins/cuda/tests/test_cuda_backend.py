"""The ``cuda`` backend: probe on this machine, probe logic with fake builds/drivers,
option checks, import-lightness, and the conformance suite when a GPU is present."""

from __future__ import annotations

import subprocess
import sys
from typing import Any, ClassVar

import pytest

from servehall import BackendSpec, ConfigError
from servehall.engines.torch import DriverCount, TorchBuild, TorchOptions
from servehall.plugin.manager import PluginHost
from servehall.testing.conformance import TinyLlamaConformance
from servehall_cuda.device import CudaDevice
from servehall_cuda.probe import probe_cuda


def _spec() -> BackendSpec:
    return PluginHost(["cuda"]).backends().get("cuda")


def test_cuda_probe_on_this_machine_is_honest() -> None:
    result = _spec().probe()
    import torch

    if torch.cuda.is_available() and torch.version.hip is None:
        assert result.available, result.reason
    else:
        assert not result.available
        assert "torch.cuda.is_available() is False" in result.reason


def test_cuda_probe_fake_cpu_build() -> None:
    r = probe_cuda(TorchBuild(True, "2.13.0+cpu"), DriverCount(1, "1 CUDA device(s) visible"))
    assert not r.available and "CPU-only build" in r.reason


def test_cuda_probe_fake_rocm_build() -> None:
    r = probe_cuda(TorchBuild(True, "2.13.0+rocm6.2", hip="6.2.4"), DriverCount(1, "x"))
    assert not r.available and "ROCm build" in r.reason


def test_cuda_probe_fake_no_visible_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    r = probe_cuda(TorchBuild(True, "2.13.0+cu126", cuda="12.6"), DriverCount(0, "0 visible"))
    assert not r.available
    assert "torch.cuda.is_available() is False" in r.reason and "CUDA_VISIBLE_DEVICES" in r.reason


def test_cuda_probe_fake_gpu_present() -> None:
    r = probe_cuda(TorchBuild(True, "2.13.0+cu126", cuda="12.6"), DriverCount(2, "2 visible"))
    assert r.available and "CUDA 12.6" in r.reason


def test_cuda_probe_torch_missing() -> None:
    assert not probe_cuda(TorchBuild(False), None).available


def test_cuda_device_accepts_flash_and_rejects_unknown_attention() -> None:
    CudaDevice().check(TorchOptions(attn_implementation="flash_attention_2"))
    with pytest.raises(ConfigError, match="not available on cuda"):
        CudaDevice().check(TorchOptions(attn_implementation="flex_magic"))
    assert CudaDevice().torch_device(TorchOptions(device_index=1)) == "cuda:1"


def test_cuda_plugin_import_is_light() -> None:
    code = (
        "import sys, servehall_cuda.plugin as p; from servehall.plugin.manager import PluginHost;"
        "PluginHost(['cuda']).backends().describe();"
        "print('HEAVY' if 'torch' in sys.modules or 'transformers' in sys.modules else 'LIGHT')"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "LIGHT", out.stderr


def _gpu_available() -> bool:
    return _spec().probe().available


@pytest.mark.skipif(not _gpu_available(), reason="no usable NVIDIA GPU here (cuda probe)")
class TestCudaConformance(TinyLlamaConformance):
    backend = "cuda"
    plugins = ("cuda",)
    model_options: ClassVar[dict[str, Any]] = {
        "dtype": "float32",
        "kv_cache_blocks": 96,
        "block_size": 16,
    }
