"""The plugin host: allow-listed entry-point loading, failures, API versions, typed calls."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from servehall.errors import PluginError
from servehall.plugins import DEFAULT_PLUGINS, PluginHost

GOOD = """
from servehall import hookimpl, BackendSpec, ProbeResult

@hookimpl
def servehall_register_backends(registry):
    registry.add(BackendSpec("fakedev", lambda: ProbeResult(False, "no fake device here"),
                             factory=lambda model: None, auto_priority=100))
"""


def test_only_enabled_entry_points_load(install_plugin: Callable[..., Path]) -> None:
    install_plugin("alpha", GOOD)
    install_plugin("beta", "raise RuntimeError('beta must not be imported')\n")
    host = PluginHost(["alpha"])
    assert host.infos["alpha"].loaded and host.infos["alpha"].enabled
    assert not host.infos["beta"].loaded and host.infos["beta"].error is None
    assert "fakedev" in host.backends().names()
    assert host.backends().owners["fakedev"] == "alpha"


def test_unknown_plugin_name_lists_installed(install_plugin: Callable[..., Path]) -> None:
    install_plugin("alpha", GOOD)
    with pytest.raises(PluginError) as err:
        PluginHost(["nosuch"])
    assert "nosuch" in str(err.value) and "alpha" in str(err.value)


def test_broken_plugin_is_reported_not_fatal(install_plugin: Callable[..., Path]) -> None:
    install_plugin("broken", "import module_that_does_not_exist\n")
    host = PluginHost(["broken"])  # must not raise
    info = host.infos["broken"]
    assert not info.loaded and "ModuleNotFoundError" in (info.error or "")
    with pytest.raises(PluginError, match="broken"):
        host.check_enabled()
    # a broken plugin that is not enabled does not stop serving
    install_plugin("fine", GOOD)
    PluginHost(["fine"], load_all=True).check_enabled()


def test_hook_api_version_is_checked(install_plugin: Callable[..., Path]) -> None:
    install_plugin("future", "SERVEHALL_HOOK_API = (2, 3)\n")
    host = PluginHost(["future"])
    assert "hook API" in (host.infos["future"].error or "")
    with pytest.raises(PluginError):
        host.check_enabled()


def test_default_plugins_register_like_third_party_ones() -> None:
    host = PluginHost([])
    names = {i.name for i in host.infos.values() if i.default}
    assert names == {f"servehall.{m.rsplit('.', 1)[-1]}" for m in DEFAULT_PLUGINS}
    assert "fcfs" in host.schedulers().names()


def test_describe_lists_hooks_and_versions(install_plugin: Callable[..., Path]) -> None:
    install_plugin("alpha", GOOD, dist="servehall-alpha", version="2.5")
    rows = {r["name"]: r for r in PluginHost([], load_all=True).describe()}
    assert rows["alpha"]["version"] == "2.5"
    assert rows["alpha"]["distribution"] == "servehall-alpha"
    assert rows["alpha"]["hooks"] == ["servehall_register_backends"]
    assert rows["alpha"]["enabled"] is False
