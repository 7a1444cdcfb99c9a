"""``backend = "auto"`` with several fake device probes (we own no GPU/NPU here), plus the
real registry of this machine: cpu is the only available torch backend."""

from __future__ import annotations

from typing import Any

import pytest

from servehall import BackendRegistry, BackendSpec, ConfigError, ProbeResult
from servehall.plugin.manager import PluginHost


def _fake(name: str, available: bool, priority: int | None, reason: str = "") -> BackendSpec:
    def probe() -> ProbeResult:
        return ProbeResult(available, reason or ("fake ok" if available else f"fake {name} off"))

    return BackendSpec(name, probe, lambda model: None, auto_priority=priority)  # type: ignore[arg-type,return-value]


def _registry(*specs: BackendSpec) -> BackendRegistry:
    reg = BackendRegistry()
    for s in specs:
        reg.add(s)
    return reg


def test_auto_fake_prefers_the_one_accelerator_over_cpu_backends() -> None:
    reg = _registry(
        _fake("cpu", True, 10),
        _fake("fake_openvino_cpu", True, 50),
        _fake("fake_cuda", True, 300),
        _fake("fake_ascend", False, 200),
    )
    assert reg.select("auto").name == "fake_cuda"


def test_auto_fake_lower_accelerator_wins_when_alone() -> None:
    reg = _registry(
        _fake("cpu", True, 10), _fake("fake_cuda", False, 300), _fake("fake_ascend", True, 200)
    )
    assert reg.select("auto").name == "fake_ascend"


def test_auto_fake_several_accelerators_is_ambiguous_and_lists_all() -> None:
    reg = _registry(
        _fake("cpu", True, 10), _fake("fake_cuda", True, 300), _fake("fake_ascend", True, 200)
    )
    with pytest.raises(ConfigError) as err:
        reg.select("auto")
    msg = str(err.value)
    assert "ambiguous" in msg and "fake_cuda" in msg and "fake_ascend" in msg and "cpu:" in msg


def test_auto_fake_no_accelerator_falls_back_to_best_cpu_backend() -> None:
    reg = _registry(
        _fake("cpu", True, 10), _fake("fake_openvino_cpu", True, 50), _fake("fake_cuda", False, 300)
    )
    assert reg.select("auto").name == "fake_openvino_cpu"


def test_auto_fake_cpu_tie_is_ambiguous() -> None:
    reg = _registry(_fake("cpu", True, 10), _fake("fake_other_cpu", True, 10))
    with pytest.raises(ConfigError, match="ambiguous"):
        reg.select("auto")


def test_auto_fake_none_available_lists_every_reason() -> None:
    reg = _registry(
        _fake("fake_cuda", False, 300, "torch.cuda.is_available() is False"),
        _fake("fake_ascend", False, 200, "torch_npu is not installed"),
        _fake("sim", True, None),
    )
    with pytest.raises(ConfigError) as err:
        reg.select("auto")
    msg = str(err.value)
    assert "no backend is available" in msg
    assert "torch.cuda.is_available() is False" in msg and "torch_npu is not installed" in msg
    assert "sim" not in msg  # excluded from auto: never a candidate


def test_auto_fake_raising_probe_is_unavailable_not_fatal() -> None:
    def boom() -> ProbeResult:
        raise RuntimeError("driver exploded")

    reg = _registry(_fake("cpu", True, 10))
    reg.add(BackendSpec("fake_cuda", boom, lambda m: None, auto_priority=300))  # type: ignore[arg-type,return-value]
    assert reg.select("auto").name == "cpu"
    assert "probe raised RuntimeError: driver exploded" in reg.probe("fake_cuda").reason


def test_named_unavailable_backend_fails_with_reason() -> None:
    reg = _registry(_fake("fake_cuda", False, 300, "torch.cuda.is_available() is False"))
    with pytest.raises(ConfigError, match=r"torch\.cuda\.is_available"):
        reg.select("fake_cuda")


def test_real_registry_on_this_machine_picks_cpu() -> None:
    installed = PluginHost(load_all=True).infos
    enabled = [n for n in ("cuda", "rocm", "ascend") if n in installed]
    reg = PluginHost(enabled).backends()
    described: dict[str, Any] = {d["name"]: d for d in reg.describe()}
    assert described["cpu"]["available"] is True
    for name in ("cuda", "rocm", "ascend"):
        if name in described:
            assert described[name]["reason"]
    if not any(described[n]["available"] for n in described if n != "cpu"):
        assert reg.select("auto").name == "cpu"
