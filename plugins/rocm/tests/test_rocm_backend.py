"""The ``rocm`` backend: probe on this machine, probe logic with fake builds/runtimes,
ROCm defaults, import-lightness, and the conformance suite when an AMD GPU is present."""

from __future__ import annotations

import subprocess
import sys
from typing import Any, ClassVar

import pytest

from servehall import BackendSpec, ConfigError
from servehall.engines.torch import DriverCount, TorchBuild, TorchOptions
from servehall.plugin.manager import PluginHost
from servehall.testing.conformance import TinyLlamaConformance
from servehall_rocm.device import RocmDevice
from servehall_rocm.probe import probe_rocm


def _spec() -> BackendSpec:
    return PluginHost(["rocm"]).backends().get("rocm")


def test_rocm_probe_on_this_machine_is_honest() -> None:
    result = _spec().probe()
    import torch

    if torch.version.hip is None:
        assert not result.available
        assert "torch.version.hip is None" in result.reason
    else:
        assert result.available == (torch.cuda.device_count() > 0), result.reason


def test_rocm_probe_fake_cuda_build() -> None:
    r = probe_rocm(TorchBuild(True, "2.13.0+cu126", cuda="12.6"), DriverCount(1, "x"))
    assert not r.available and "CUDA 12.6 build" in r.reason


def test_rocm_probe_fake_no_visible_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HIP_VISIBLE_DEVICES", "")
    r = probe_rocm(TorchBuild(True, "2.13.0+rocm6.2", hip="6.2.4"), DriverCount(0, "0 visible"))
    assert not r.available and "HIP_VISIBLE_DEVICES=''" in r.reason


def test_rocm_probe_fake_gpu_present() -> None:
    r = probe_rocm(TorchBuild(True, "2.13.0+rocm6.2", hip="6.2.4"), DriverCount(1, "1 visible"))
    assert r.available and "HIP 6.2.4" in r.reason


def test_rocm_defaults() -> None:
    dev = RocmDevice()
    assert dev.visible_env == "HIP_VISIBLE_DEVICES"
    dev.check(TorchOptions(attn_implementation="flash_attention_2"))
    with pytest.raises(ConfigError):
        dev.check(TorchOptions(attn_implementation="flash_attention_3"))
    assert dev.torch_device(TorchOptions(device_index=2)) == "cuda:2"
    assert "HIP_VISIBLE_DEVICES" in dev.describe(TorchOptions())


def test_rocm_plugin_import_is_light() -> None:
    code = (
        "import sys, servehall_rocm.plugin; from servehall.plugin.manager import PluginHost;"
        "PluginHost(['rocm']).backends().describe();"
        "print('HEAVY' if 'torch' in sys.modules or 'transformers' in sys.modules else 'LIGHT')"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "LIGHT", out.stderr


@pytest.mark.skipif(not _spec().probe().available, reason="no usable ROCm GPU here (rocm probe)")
class TestRocmConformance(TinyLlamaConformance):
    backend = "rocm"
    plugins = ("rocm",)
    model_options: ClassVar[dict[str, Any]] = {
        "dtype": "float32",
        "kv_cache_blocks": 96,
        "block_size": 16,
    }
