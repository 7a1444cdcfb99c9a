"""Tests of servehall.engines.torch.device: the device adapters' option checks, device
strings and descriptions. No CUDA device exists here: the ``torch.cuda`` paths are checked
only where a CPU-only torch gives a definite answer (no devices visible)."""

from __future__ import annotations

import pytest

from servehall import ConfigError
from servehall.engines.torch.device import PORTABLE_ATTN, CpuDevice, CudaApiDevice, TorchDevice
from servehall.engines.torch.options import TorchOptions


class FakeNpuDevice(TorchDevice):
    """A device plugin's adapter for a device type that does not exist here."""

    type = "npu"


def test_torch_device_strings() -> None:
    assert CpuDevice().torch_device(TorchOptions(device_index=3)) == "cpu"
    assert CudaApiDevice().torch_device(TorchOptions()) == "cuda:0"
    assert CudaApiDevice().torch_device(TorchOptions(device_index=2)) == "cuda:2"
    assert FakeNpuDevice().torch_device(TorchOptions(device_index=1)) == "npu:1"


@pytest.mark.parametrize("attn", sorted(PORTABLE_ATTN))
def test_portable_attention_is_accepted_everywhere(attn: str) -> None:
    for device in (CpuDevice(), CudaApiDevice(), FakeNpuDevice()):
        device.check(TorchOptions(attn_implementation=attn))


def test_flash_attention_only_on_cuda_api_devices() -> None:
    opts = TorchOptions(attn_implementation="flash_attention_2")
    CudaApiDevice().check(opts)
    with pytest.raises(ConfigError, match=r"not available on cpu; use one of \['eager', 'sdpa'\]"):
        CpuDevice().check(opts)
    with pytest.raises(ConfigError, match="not available on npu"):
        FakeNpuDevice().check(opts)
    with pytest.raises(ConfigError, match="'flex' is not available on cuda"):
        CudaApiDevice().check(TorchOptions(attn_implementation="flex"))


def test_cpu_dtypes() -> None:
    cpu = CpuDevice()
    assert cpu.resolve_dtype(TorchOptions()) == "float32"
    assert cpu.resolve_dtype(TorchOptions(dtype="bf16")) == "bfloat16"
    assert cpu.resolve_dtype(TorchOptions(dtype="fp32")) == "float32"
    with pytest.raises(ConfigError, match="'float16' is not supported by the cpu backend"):
        cpu.resolve_dtype(TorchOptions(dtype="fp16"))
    # the base adapter does not refuse float16
    assert FakeNpuDevice().resolve_dtype(TorchOptions(dtype="fp16")) == "float16"


def test_cpu_memory_figures_are_real() -> None:
    psutil = pytest.importorskip("psutil")
    cpu = CpuDevice()
    free = cpu.free_memory_bytes(TorchOptions())
    used, total = cpu.memory_usage(TorchOptions())
    assert free is not None and used is not None and total is not None
    assert 0 < free <= total == psutil.virtual_memory().total
    assert 0 < used < total


def test_default_kv_policy() -> None:
    assert CpuDevice.default_kv_fraction == 0.05 and CpuDevice.max_default_kv_blocks == 4096
    assert CudaApiDevice.default_kv_fraction == 0.8 and CudaApiDevice.max_default_kv_blocks is None


def test_describe_names_the_visible_devices_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    assert CpuDevice().describe(TorchOptions()) == {"device": "cpu"}
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,3")
    assert CudaApiDevice().describe(TorchOptions(device_index=1)) == {
        "device": "cuda:1",
        "CUDA_VISIBLE_DEVICES": "1,3",
    }

    class FakeHipDevice(CudaApiDevice):
        visible_env = "HIP_VISIBLE_DEVICES"

    monkeypatch.delenv("HIP_VISIBLE_DEVICES", raising=False)
    assert FakeHipDevice().describe(TorchOptions()) == {
        "device": "cuda:0",
        "HIP_VISIBLE_DEVICES": None,
    }


def test_cuda_setup_with_no_visible_device_is_a_config_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.device_count():
        pytest.skip("a CUDA device is visible")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    with pytest.raises(
        ConfigError,
        match=r"device_index 0 is out of range: 0 device\(s\) visible "
        r"\(CUDA_VISIBLE_DEVICES=\)",
    ):
        CudaApiDevice().setup(TorchOptions())
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    with pytest.raises(
        ConfigError, match=r"device_index 2 is out of range: 0 device\(s\) visible$"
    ):
        CudaApiDevice().setup(TorchOptions(device_index=2))


def test_cuda_memory_usage_without_a_device_is_unknown() -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.device_count():
        pytest.skip("a CUDA device is visible")
    assert CudaApiDevice().memory_usage(TorchOptions()) == (None, None)
