"""Tests of servehall.devices: the public device-plugin API re-exports the engines' names,
stays import-light (no torch, onnxruntime or vLLM until an engine class is read) and loads
``TorchEngine`` on first access."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import servehall
import servehall.devices as devices


def test_every_exported_name_resolves_to_the_engines_object() -> None:
    from servehall.engines import onnxruntime, select, torch, vllm

    sources = [torch, onnxruntime, vllm, select]
    for name in devices.__all__:
        value = getattr(devices, name)
        homes = [src for src in sources if name in vars(src) or hasattr(src, name)]
        assert homes, f"{name} is not defined by an engine package"
        assert value is getattr(homes[0], name), name


def test_all_is_sorted_and_complete() -> None:
    assert devices.__all__ == sorted(devices.__all__)
    public = {
        n for n, v in vars(devices).items() if not n.startswith("_") and not isinstance(v, type(os))
    } - {"annotations", "lazy_names", "TYPE_CHECKING"}
    assert public <= set(devices.__all__)
    assert "TorchEngine" in devices.__all__


def test_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match=r"'servehall\.devices' has no attribute 'GpuEngine'"):
        _ = devices.GpuEngine  # type: ignore[attr-defined]


def test_torch_device_subclass_as_the_docs_show() -> None:
    class FakeXpuDevice(devices.TorchDevice):
        type = "xpu"

    opts = devices.parse_torch_options({"device_index": 1})
    assert FakeXpuDevice().torch_device(opts) == "xpu:1"
    assert issubclass(devices.CpuDevice, devices.TorchDevice)
    assert issubclass(devices.CudaApiDevice, devices.TorchDevice)


def test_import_is_light_and_torch_engine_loads_on_access() -> None:
    code = (
        "import json, sys\n"
        "import servehall.devices as d\n"
        "heavy = ('torch', 'onnxruntime_genai', 'onnxruntime', 'vllm', 'transformers')\n"
        "before = [m for m in heavy if m in sys.modules]\n"
        "engine = d.TorchEngine\n"
        "print(json.dumps([before, engine.__module__]))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(servehall.__file__).parent.parent)}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    before, module = json.loads(out.stdout)
    assert before == []
    assert module == "servehall.engines.torch.engine"
