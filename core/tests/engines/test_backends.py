"""Tests of servehall.engines.backends: the backend registry (add, get, probe, select of a
named backend, describe) and BackendSpec's prepare/worker-defaults resolution. The
``auto`` ordering across fake accelerators is tested in ``torch/test_backend_auto.py``."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from servehall import BackendRegistry, BackendSpec, ConfigError, ModelConfig, ProbeResult
from servehall.engines.backends import ACCELERATOR_PRIORITY


def _no_engine(model: ModelConfig) -> Any:
    raise AssertionError("the factory is not called by the registry")


def _spec(name: str, available: bool = True, priority: int | None = 10, **kw: Any) -> BackendSpec:
    return BackendSpec(
        name, lambda: ProbeResult(available, f"{name} says {available}"), _no_engine, priority, **kw
    )


def _model(**worker: Any) -> ModelConfig:
    return ModelConfig(name="m", path=Path("/nonexistent"), backend="cpu", worker=worker)


def test_add_get_names_and_specs_are_sorted() -> None:
    reg = BackendRegistry()
    b, a = _spec("b"), _spec("a")
    reg.add(b)
    reg.add(a)
    assert reg.get("a") is a and reg.names() == ["a", "b"] and reg.specs() == [a, b]
    assert reg.owners == {"b": "?", "a": "?"}


def test_unknown_backend_lists_known_ones() -> None:
    with pytest.raises(ConfigError, match="unknown backend 'x'; registered backends: none"):
        BackendRegistry().get("x")
    reg = BackendRegistry()
    reg.add(_spec("cpu"))
    reg.add(_spec("cuda"))
    with pytest.raises(ConfigError, match="unknown backend 'x'; registered backends: cpu, cuda"):
        reg.select("x")


def test_duplicate_name_names_both_owners() -> None:
    owners = iter(["plugin_one", "plugin_two"])
    depths: list[int] = []

    def owner_of(depth: int) -> str:
        depths.append(depth)
        return next(owners)

    reg = BackendRegistry(owner_of)
    reg.add(_spec("cpu"))
    with pytest.raises(
        ConfigError, match="backend 'cpu' registered twice \\(by 'plugin_one' and 'plugin_two'\\)"
    ):
        reg.add(_spec("cpu"))
    assert depths == [1, 1] and reg.owners == {"cpu": "plugin_one"}


def test_a_raising_probe_is_unavailable_not_an_error() -> None:
    def probe() -> ProbeResult:
        raise OSError("driver exploded")

    reg = BackendRegistry()
    reg.add(BackendSpec("boom", probe, _no_engine))
    assert reg.probe("boom") == ProbeResult(False, "probe raised OSError: driver exploded")
    with pytest.raises(ConfigError, match="backend 'boom' is not available: probe raised OSError"):
        reg.select("boom")
    with pytest.raises(ConfigError, match="boom: unavailable \\(probe raised OSError"):
        reg.select("auto")


def test_select_by_name_ignores_auto_priority() -> None:
    reg = BackendRegistry()
    reg.add(_spec("sim", priority=None))
    assert reg.select("sim").name == "sim"
    reg.add(_spec("off", available=False))
    with pytest.raises(ConfigError, match="backend 'off' is not available: off says False"):
        reg.select("off")


def test_accelerator_threshold_is_inclusive() -> None:
    reg = BackendRegistry()
    reg.add(_spec("cpu_high", priority=ACCELERATOR_PRIORITY - 1))
    reg.add(_spec("accel", priority=ACCELERATOR_PRIORITY))
    assert reg.select("auto").name == "accel"
    # below the threshold two backends are ordered by priority instead of being ambiguous
    reg2 = BackendRegistry()
    reg2.add(_spec("low", priority=1))
    reg2.add(_spec("high", priority=ACCELERATOR_PRIORITY - 1))
    assert reg2.select("auto").name == "high"


def test_auto_with_no_candidates_says_none() -> None:
    with pytest.raises(ConfigError, match="no backend is available — none"):
        BackendRegistry().select("auto")


def test_describe_reports_each_probe() -> None:
    reg = BackendRegistry(lambda depth: "core")
    reg.add(_spec("cpu"))
    reg.add(_spec("cuda", available=False, priority=300))
    assert reg.describe() == [
        {
            "name": "cpu",
            "plugin": "core",
            "available": True,
            "reason": "cpu says True",
            "auto_priority": 10,
        },
        {
            "name": "cuda",
            "plugin": "core",
            "available": False,
            "reason": "cuda says False",
            "auto_priority": 300,
        },
    ]


class FactoryWithHooks:
    """A factory object offering ``prepare`` and ``worker_defaults`` methods."""

    def __init__(self) -> None:
        self.prepared: list[str] = []

    def __call__(self, model: ModelConfig) -> Any:
        raise AssertionError("not built")

    def prepare(self, model: ModelConfig) -> None:
        self.prepared.append(model.name)

    def worker_defaults(self, model: ModelConfig) -> Mapping[str, Any]:
        return {"heartbeat_timeout_s": 10.0, "start_timeout_s": 5.0}


def test_prepare_step_prefers_the_spec_then_the_factory() -> None:
    factory = FactoryWithHooks()
    spec = BackendSpec("x", lambda: ProbeResult(True, ""), factory)
    step = spec.prepare_step()
    assert step is not None
    step(_model())
    assert factory.prepared == ["m"]
    own: list[str] = []
    spec2 = BackendSpec(
        "x", lambda: ProbeResult(True, ""), factory, prepare=lambda m: own.append("own")
    )
    step2 = spec2.prepare_step()
    assert step2 is not None
    step2(_model())
    assert own == ["own"] and factory.prepared == ["m"]
    assert _spec("plain").prepare_step() is None


def test_worker_settings_fill_only_unset_keys() -> None:
    spec = BackendSpec("x", lambda: ProbeResult(True, ""), FactoryWithHooks())
    settings = spec.worker_settings(_model(start_timeout_s=60))
    assert settings.heartbeat_timeout_s == 10.0  # the engine's default
    assert settings.start_timeout_s == 60  # the config wins
    # a key set to its global default value still counts as set
    assert spec.worker_settings(_model(heartbeat_timeout_s=1.0)).heartbeat_timeout_s == 1.0


def test_worker_settings_without_defaults_returns_the_model_settings() -> None:
    model = _model(stop_timeout_s=3)
    assert _spec("plain").worker_settings(model) is model.worker
    spec = BackendSpec("x", lambda: ProbeResult(True, ""), _no_engine, worker_defaults=lambda m: {})
    assert spec.worker_settings(model) is model.worker


def test_invalid_merged_worker_settings_name_the_key() -> None:
    spec = BackendSpec(
        "vllm",
        lambda: ProbeResult(True, ""),
        FactoryWithHooks(),
        worker_defaults=lambda m: {"heartbeat_interval_s": 50},
    )
    with pytest.raises(ConfigError) as err:
        spec.worker_settings(_model())
    assert err.value.errors[0][0] == "models.m.worker"
    assert "with the vllm engine's defaults {'heartbeat_interval_s': 50}" in str(err.value)
