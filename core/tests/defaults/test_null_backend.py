"""Tests of servehall.defaults.null_backend: backend ``null`` is registered by the default
plugin, always available, and never chosen by ``auto``."""

from __future__ import annotations

import json
from pathlib import Path

from servehall.config.models import ModelConfig
from servehall.defaults.null_backend import probe_null, servehall_register_backends
from servehall.engines.backends import BackendRegistry
from servehall.engines.null import NullEngine
from servehall.errors import ConfigError
from servehall.plugin.manager import PluginHost


def test_registered_by_default_and_never_chosen_by_auto() -> None:
    backends = PluginHost([]).backends()
    spec = backends.get("null")
    assert spec.auto_priority is None
    assert backends.probe("null").available
    assert backends.select("null") is spec
    try:
        chosen = backends.select("auto")
    except ConfigError as exc:  # no other backend available: auto must not fall back to null
        assert "null" not in str(exc)
    else:
        assert chosen.name != "null"


def test_probe_needs_nothing() -> None:
    result = probe_null()
    assert result.available and "never chosen by auto" in result.reason


def test_the_hook_registers_a_factory_of_unstarted_null_engines(tmp_path: Path) -> None:
    reg = BackendRegistry()
    servehall_register_backends(reg)
    spec = reg.get("null")
    assert reg.names() == ["null"] and spec.auto_priority is None and spec.description
    (tmp_path / "config.json").write_text(json.dumps({"vocab_size": 10, "eos_token_id": 2}))
    engine = spec.factory(ModelConfig(name="n", path=tmp_path, backend="null"))
    assert isinstance(engine, NullEngine)
    # alone in a registry, auto finds nothing rather than falling back to null
    try:
        reg.select("auto")
    except ConfigError as exc:
        assert "no backend is available — none" in str(exc)
    else:
        raise AssertionError("auto chose the null backend")
