"""The ``ascend`` NPU adapter: honest probe here, probe steps with fakes, the import guard
against a broken torch_npu (a fake torch_npu distribution), device logic on the
simulated runtime, and the conformance suite on ``ascend-simulated``."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any, ClassVar

import pytest

from servehall import ConfigError, ModelConfig
from servehall.engines.torch import TorchOptions
from servehall.errors import ConfigError as CoreConfigError
from servehall.plugin.manager import PluginHost
from servehall.testing.conformance import TinyLlamaConformance
from servehall_ascend_stub.device import NpuDevice, SimulatedNpuDevice
from servehall_ascend_stub.probe import probe_ascend, visible_after_filter
from servehall_ascend_stub.runtime import SimulatedNpuRuntime


def _registry() -> Any:
    return PluginHost(["ascend"]).backends()


# --- probe ---------------------------------------------------------------------------


def test_ascend_probe_on_this_machine_is_honest() -> None:
    result = _registry().probe("ascend")
    try:
        import importlib.util

        has_npu_pkg = importlib.util.find_spec("torch_npu") is not None
    except Exception:
        has_npu_pkg = False
    if not has_npu_pkg:
        assert not result.available and "torch_npu is not installed" in result.reason
    assert result.reason


def test_ascend_probe_fake_steps_report_first_failure(tmp_path: Path) -> None:
    def never() -> tuple[int, str]:
        raise AssertionError("subprocess check must not run before static checks pass")

    r = probe_ascend(installed=lambda: True, cann=lambda: None, counter=never)
    assert not r.available and "CANN" in r.reason
    r = probe_ascend(installed=lambda: True, cann=lambda: tmp_path, nodes=list, counter=never)
    assert not r.available and "/dev/davinci" in r.reason


def test_ascend_probe_fake_visible_devices_filter(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ASCEND_RT_VISIBLE_DEVICES", "5")
    r = probe_ascend(
        installed=lambda: True, cann=lambda: tmp_path, nodes=lambda: [0, 1], counter=lambda: (2, "")
    )
    assert not r.available and "ASCEND_RT_VISIBLE_DEVICES='5'" in r.reason
    assert visible_after_filter([0, 1, 2], "2,0") == [2, 0]
    assert visible_after_filter([0, 1], None) == [0, 1]


def test_ascend_probe_fake_npu_present(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ASCEND_RT_VISIBLE_DEVICES", raising=False)
    r = probe_ascend(
        installed=lambda: True,
        cann=lambda: tmp_path,
        nodes=lambda: [0, 1],
        counter=lambda: (2, "2 NPU(s) visible to torch_npu"),
    )
    assert r.available and "2 NPU(s)" in r.reason
    broken = probe_ascend(
        installed=lambda: True,
        cann=lambda: tmp_path,
        nodes=lambda: [0],
        counter=lambda: (0, "import torch_npu failed: libhccl.so missing"),
    )
    assert not broken.available and "libhccl" in broken.reason


# --- a broken torch_npu must not break the host ----------------------------------------


def _fake_broken_torch_npu(site: Path) -> None:
    """A torch_npu that fails like one installed without CANN, hooked into torch autoload."""
    pkg = site / "torch_npu"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(
        "raise ImportError('libascend_hal.so: cannot open shared object file')\n"
        "def _autoload():\n    pass\n"
    )
    info = site / "torch_npu-2.5.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: torch_npu\nVersion: 2.5.1\n")
    (info / "entry_points.txt").write_text("[torch.backends]\ntorch_npu = torch_npu:_autoload\n")


def _run(code: str, site: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "TORCH_DEVICE_BACKEND_AUTOLOAD"}
    env["PYTHONPATH"] = str(site) + os.pathsep + env.get("PYTHONPATH", "")
    for k in ("ASCEND_HOME_PATH", "ASCEND_TOOLKIT_HOME", "ASCEND_OPP_PATH"):
        env.pop(k, None)
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


def test_fake_broken_torch_npu_breaks_plain_torch_import(tmp_path: Path) -> None:
    """Control: the fake really reproduces the failure the guard exists for."""
    _fake_broken_torch_npu(tmp_path)
    out = _run("import torch", tmp_path)
    assert out.returncode != 0 and "TORCH_DEVICE_BACKEND_AUTOLOAD" in out.stderr


def test_ascend_guard_keeps_host_alive_with_fake_broken_torch_npu(tmp_path: Path) -> None:
    _fake_broken_torch_npu(tmp_path)
    out = _run(
        """
        import os, sys
        from servehall.plugin.manager import PluginHost
        reg = PluginHost(["ascend"]).backends()
        r = reg.probe("ascend")
        print("PROBE", r.available, r.reason)
        print("NPU_IMPORTED", "torch_npu" in sys.modules)
        print("AUTOLOAD", os.environ.get("TORCH_DEVICE_BACKEND_AUTOLOAD"))
        import torch
        print("TORCH_OK", torch.ones(2).sum().item())
        """,
        tmp_path,
    )
    assert out.returncode == 0, out.stderr
    assert "PROBE False torch_npu is installed but the Ascend CANN toolkit is not" in out.stdout
    assert "NPU_IMPORTED False" in out.stdout
    assert "AUTOLOAD 0" in out.stdout and "TORCH_OK 2.0" in out.stdout


# --- adapter logic on the simulated runtime --------------------------------------------


def test_npu_device_index_checked_against_visible_devices(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    dev = NpuDevice(SimulatedNpuRuntime(devices=2))
    monkeypatch.setenv("ASCEND_RT_VISIBLE_DEVICES", "1")
    dev.setup(TorchOptions(device_index=0))
    with pytest.raises(ConfigError, match="ASCEND_RT_VISIBLE_DEVICES=1"):
        dev.setup(TorchOptions(device_index=1))
    monkeypatch.delenv("ASCEND_RT_VISIBLE_DEVICES")
    dev.setup(TorchOptions(device_index=1))
    assert isinstance(dev.runtime, SimulatedNpuRuntime) and dev.runtime.current == 1


def test_npu_device_dtype_and_memory() -> None:
    no_bf16 = NpuDevice(SimulatedNpuRuntime(bf16=False, memory_bytes=1 << 40))
    assert no_bf16.resolve_dtype(TorchOptions()) == "float16"
    with pytest.raises(CoreConfigError, match="bfloat16"):
        no_bf16.resolve_dtype(TorchOptions(dtype="bf16"))
    assert SimulatedNpuDevice().resolve_dtype(TorchOptions()) == "bfloat16"
    used, total = no_bf16.memory_usage(TorchOptions())
    assert total == 1 << 40 and used is not None and 0 < used < total
    assert no_bf16.free_memory_bytes(TorchOptions()) == total - used
    real = NpuDevice()
    assert real.torch_device(TorchOptions(device_index=3)) == "npu:3"
    assert SimulatedNpuDevice().torch_device(TorchOptions(device_index=3)) == "cpu"


async def test_ascend_simulated_engine_selects_device_on_load_and_step_threads(
    servehall_tiny_llama: Path,
) -> None:
    model = ModelConfig(
        name="tiny",
        path=servehall_tiny_llama,
        backend="ascend-simulated",
        max_model_len=128,
        options={"dtype": "float32", "kv_cache_blocks": 16, "block_size": 16},
    )
    engine: Any = _registry().get("ascend-simulated").factory(model)
    await engine.start()
    try:
        runtime = engine.device.runtime
        assert runtime.current == 0
        assert len(set(runtime.set_device_threads)) == 2  # loader thread + step thread
        info = engine.model_info.extra
        assert info["npu_runtime"] == "simulated" and info["device"] == "cpu"
        stats = engine.stats()
        assert stats.device_memory_total_bytes == runtime.memory_bytes
    finally:
        await engine.shutdown()
    assert runtime.cache_releases == 1


def test_ascend_simulated_is_never_chosen_by_auto() -> None:
    reg = _registry()
    assert reg.get("ascend-simulated").auto_priority is None
    assert reg.select("auto").name != "ascend-simulated"


# --- conformance ---------------------------------------------------------------------


class TestAscendSimulatedConformance(TinyLlamaConformance):
    backend = "ascend-simulated"
    plugins = ("ascend",)
    probe_backend = "ascend"
    # no kv_cache_blocks: sized from the simulated NPU's free memory
    model_options: ClassVar[dict[str, Any]] = {
        "dtype": "float32",
        "kv_cache_memory_fraction": 0.001,
        "block_size": 16,
    }
