"""Tests of servehall.server.bootstrap: loading a deployment from a real config file —
plugins enabled, names the config uses checked against what the plugins register, every
problem listed at once with its key path."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest

from servehall import ConfigError
from servehall.config.settings import load_settings
from servehall.errors import PluginError
from servehall.plugin.manager import PluginHost
from servehall.server.bootstrap import check_names, check_scheduler_tenants, load_deployment


def _config(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "servehall.toml"
    path.write_text(text)
    return path


GOOD = """
[scheduler]
policy = "priority"
aging_s = 5

[[sinks]]
name = "jsonl"
options = { path = "-" }

[[models]]
name = "null"
path = "/nonexistent"
backend = "null"
"""


def test_a_good_deployment_loads(tmp_path: Path) -> None:
    settings, plugins = load_deployment(_config(tmp_path, GOOD))
    assert settings.scheduler.policy == "priority"
    assert [m.name for m in settings.models] == ["null"]
    assert "null" in plugins.backends().names()


def test_every_unknown_name_is_listed_at_once(tmp_path: Path) -> None:
    bad = """
[scheduler]
policy = "lottery"

[[sinks]]
name = "kafka"

[[models]]
name = "m"
path = "/nonexistent"
backend = "tpu"

[[models]]
name = "a"
path = "/nonexistent"
backend = "auto"
"""
    with pytest.raises(ConfigError) as err:
        load_deployment(_config(tmp_path, bad))
    keys = [k for k, _ in err.value.errors]
    assert keys == ["scheduler.policy", "sinks[0].name", "models[0].backend"]
    msg = str(err.value)
    assert msg.startswith("3 config error(s):\n  scheduler.policy: unknown policy 'lottery'")
    assert "known: fair, fcfs, priority" in msg
    assert "unknown backend 'tpu'; registered backends: " in msg and "or auto" in msg


def test_an_unknown_enabled_plugin_refuses_to_start(tmp_path: Path) -> None:
    cfg = _config(tmp_path, '[plugins]\nenabled = ["no_such_plugin_xyz"]\n')
    with pytest.raises(PluginError, match="no_such_plugin_xyz"):
        load_deployment(cfg)


def test_load_all_skips_the_name_checks(tmp_path: Path) -> None:
    cfg = _config(tmp_path, '[scheduler]\npolicy = "lottery"\n')
    settings, _ = load_deployment(cfg, load_all=True)
    assert settings.scheduler.policy == "lottery"


def test_installed_but_disabled_plugins_are_hinted(
    install_plugin: Callable[..., Path], tmp_path: Path
) -> None:
    install_plugin("idle_sched", "X = 1\n")
    settings = load_settings(data={"scheduler": {"policy": "lottery"}})
    host = PluginHost([], load_all=False)
    with pytest.raises(ConfigError) as err:
        check_names(settings, host)
    hint = re.search(
        r"\(installed but not enabled in \[plugins\] enabled: ([^)]*)\)", str(err.value)
    )
    assert hint is not None and "idle_sched" in hint.group(1).split(", ")


def test_scheduler_tenant_and_policy_settings() -> None:
    host = PluginHost([])
    specs = host.schedulers()
    fcfs = load_settings(data={"scheduler": {"policy": "fcfs", "tenants": {"t": {"weight": 2}}}})
    assert check_scheduler_tenants(fcfs, specs.get("fcfs")) == [
        ("scheduler.tenants.t", "policy 'fcfs' has no tenant settings")
    ]
    fair = load_settings(
        data={"scheduler": {"policy": "fair", "aging_s": 3, "tenants": {"t": {"weight": 2}}}}
    )
    assert check_scheduler_tenants(fair, specs.get("fair")) == [
        ("scheduler.aging_s", "not used by policy 'fair' (it reads: burst_slots)")
    ]
    prio = load_settings(
        data={"scheduler": {"policy": "priority", "tenants": {"t": {"weight": 2}}}}
    )
    assert check_scheduler_tenants(prio, specs.get("priority")) == [
        ("scheduler.tenants.t.weight", "not used by policy 'priority' (it reads: max_queue)")
    ]
    fcfs_aging = load_settings(data={"scheduler": {"policy": "fcfs", "burst_slots": 1}})
    assert check_scheduler_tenants(fcfs_aging, specs.get("fcfs")) == [
        ("scheduler.burst_slots", "not used by policy 'fcfs' (it reads: none)")
    ]
