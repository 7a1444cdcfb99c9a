"""``servehall.plugin.host``: version keys, the served names clients may send (configured
order, once each, removed versions left out) and the replica name a host takes."""

from __future__ import annotations

from typing import Any, cast

from servehall.config.settings import Settings
from servehall.plugin.host import Host, ServedModel, model_key
from servehall.plugin.manager import PluginHost
from servehall.replica import replica_name


def _served(name: str, version: str = "", state: str = "serving") -> ServedModel:
    return ServedModel(
        name=name,
        backend="null",
        engine=cast(Any, None),
        scheduler=cast(Any, None),
        tokenizer=None,
        max_model_len=64,
        version=version,
        state=state,
    )


def test_model_key() -> None:
    assert model_key("m", "") == "m"
    assert model_key("m", "v2") == "m@v2"
    assert _served("m", "v2").key == "m@v2" and _served("m").key == "m"


def test_served_names_in_order_once_without_removed() -> None:
    host = Host(settings=Settings(), plugins=PluginHost([]))
    for s in (
        _served("b", "v1"),
        _served("a"),
        _served("b", "v2", state="loading"),
        _served("gone", state="removed"),
        _served("c", state="unloaded"),
    ):
        host.models[s.key] = s
    assert host.served_names() == ["b", "a", "c"]
    host.models["b@v1"].state = "removed"
    assert host.served_names() == ["a", "b", "c"]  # v2 (configured after a) still serves it
    host.models["b@v2"].state = "removed"
    assert host.served_names() == ["a", "c"]


def test_replica_name() -> None:
    named = Host(settings=Settings(server={"replica": "r-7"}), plugins=PluginHost([]))
    assert named.replica == "r-7"
    default = Host(settings=Settings(), plugins=PluginHost([]))
    assert default.replica == replica_name(None) and default.replica
    given = Host(settings=Settings(server={"replica": "r-7"}), plugins=PluginHost([]), replica="x")
    assert given.replica == "x"


def test_each_host_has_its_own_state() -> None:
    a = Host(settings=Settings(), plugins=PluginHost([]))
    b = Host(settings=Settings(), plugins=PluginHost([]))
    assert a.models is not b.models and a.pulls is not b.pulls and a.state is not b.state
    assert a.records is None and a.on_canary_rollback is None
