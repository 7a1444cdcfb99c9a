"""The plugin host: allow-listed entry-point loading, failures, API versions, typed calls."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from servehall.errors import PluginError
from servehall.plugin.manager import DEFAULT_PLUGINS, PluginHost

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


@pytest.mark.parametrize("declared", ["(1, 2)", '"1"', '"1.4"', "(3, 4)"])
def test_hook_api_major_mismatch_is_refused_naming_both(
    install_plugin: Callable[..., Path], declared: str
) -> None:
    install_plugin("old", f"SERVEHALL_HOOK_API = {declared}\n")
    host = PluginHost(["old"])
    with pytest.raises(PluginError) as err:
        host.check_enabled()
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith("plugin 'old'")
    assert "hook API 2.0" in msg and ("1.x" in msg or "3.x" in msg), msg


def test_current_hook_api_is_accepted(install_plugin: Callable[..., Path]) -> None:
    install_plugin("now", 'SERVEHALL_HOOK_API = "2"\n')
    host = PluginHost(["now"])
    host.check_enabled()
    assert host.infos["now"].hook_api == "2.x"


def test_misspelled_hook_is_one_line_naming_plugin_and_hook(
    install_plugin: Callable[..., Path],
) -> None:
    install_plugin(
        "typo",
        "from servehall import hookimpl\n"
        "@hookimpl\ndef servehall_register_backend(registry):\n    pass\n",
    )
    host = PluginHost(["typo"])  # loads, records, unregisters
    with pytest.raises(PluginError) as err:
        host.check_enabled()
    msg = str(err.value)
    assert "\n" not in msg
    assert "plugin 'typo'" in msg and "'servehall_register_backend'" in msg
    assert host.pm.get_plugin("typo") is None  # none of its hooks can run


def test_hook_argument_not_in_spec_is_refused(install_plugin: Callable[..., Path]) -> None:
    install_plugin(
        "v1auth",
        "from servehall import hookimpl\n"
        "@hookimpl\ndef servehall_authenticate(request, settings):\n    return None\n",
    )
    with pytest.raises(PluginError) as err:
        PluginHost(["v1auth"]).check_enabled()
    assert "plugin 'v1auth'" in str(err.value) and "settings" in str(err.value)


def test_entry_point_that_fails_to_import_is_one_line(install_plugin: Callable[..., Path]) -> None:
    install_plugin("boom", "raise RuntimeError('boom at import\\nsecond line')\n")
    with pytest.raises(PluginError) as err:
        PluginHost(["boom"]).check_enabled()
    assert str(err.value) == "plugin 'boom': RuntimeError: boom at import"


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


ORDER_PLUGIN = """
from servehall import hookimpl, SchedulerSpec

@hookimpl{marker}
def servehall_register_schedulers(registry):
    registry.add(SchedulerSpec("{name}-" + str(len(registry.names())), lambda s: None))
"""


def _order(host: PluginHost) -> list[str]:
    names = [n for n in host.schedulers().names() if "-" in n]
    return [n.split("-")[0] for n in sorted(names, key=lambda n: int(n.split("-")[1]))]


def test_chain_order_follows_enabled_list(install_plugin: Callable[..., Path]) -> None:
    for name in ("a", "b", "c"):
        install_plugin(name, ORDER_PLUGIN.format(marker="", name=name))
    # defaults (fcfs) first, then [plugins] enabled in its order
    assert _order(PluginHost(["b", "a", "c"])) == ["b", "a", "c"]
    assert _order(PluginHost(["c", "b", "a"])) == ["c", "b", "a"]


def test_tryfirst_and_trylast_reorder_the_chain(install_plugin: Callable[..., Path]) -> None:
    install_plugin("first", ORDER_PLUGIN.format(marker="(tryfirst=True)", name="first"))
    install_plugin("last", ORDER_PLUGIN.format(marker="(trylast=True)", name="last"))
    install_plugin("plain", ORDER_PLUGIN.format(marker="", name="plain"))
    assert _order(PluginHost(["last", "plain", "first"])) == ["first", "plain", "last"]


def test_wrappers_and_subset_arguments_work_as_pluggy_documents() -> None:
    from servehall import Principal, hookimpl

    seen: list[str] = []

    class Wrapper:
        @hookimpl(wrapper=True)
        def servehall_authenticate(self, request: object):  # type: ignore[no-untyped-def]
            seen.append("before")
            result = yield
            seen.append(f"after {len(result)}")
            return result

    class NoArgs:  # declares none of (host, request)
        @hookimpl
        def servehall_authenticate(self) -> Principal:
            seen.append("noargs")
            return Principal(id="p")

    import asyncio

    host = PluginHost([], extra=[("w", Wrapper()), ("n", NoArgs())])
    principal = asyncio.run(host.authenticate(None, None))  # type: ignore[arg-type]
    assert principal is not None and principal.id == "p"
    assert seen == ["before", "noargs", "after 1"]


def test_a_wrapper_of_an_async_hook_sees_unawaited_coroutines() -> None:
    """What docs/hooks.md says of wrappers around async hooks: the wrapper runs, and
    returns, before the async implementations' bodies run; it sees their coroutines."""
    import asyncio
    import inspect

    from servehall import Principal, hookimpl

    seen: list[str] = []

    class Wrapper:
        @hookimpl(wrapper=True)
        def servehall_authenticate(self, request: object):  # type: ignore[no-untyped-def]
            result = yield
            seen.append("wrapper sees " + ",".join(type(r).__name__ for r in result))
            assert all(inspect.iscoroutine(r) for r in result)
            return result

    class AsyncAuth:
        @hookimpl
        async def servehall_authenticate(self) -> Principal:
            seen.append("async body runs")
            return Principal(id="a")

    host = PluginHost([], extra=[("w", Wrapper()), ("a", AsyncAuth())])
    principal = asyncio.run(host.authenticate(None, None))  # type: ignore[arg-type]
    assert principal is not None and principal.id == "a"
    assert seen == ["wrapper sees coroutine", "async body runs"]


def test_backend_check_options_runs_at_config_check() -> None:
    """``BackendSpec.check_options`` validates ``[[models]] options`` when the config is
    loaded or checked: its errors join the others; a backend without one is not asked."""
    from servehall import BackendRegistry, BackendSpec, ConfigError, ProbeResult, hookimpl
    from servehall.config.models import ModelConfig
    from servehall.config.settings import load_settings
    from servehall.server.bootstrap import check_names

    def check(model: ModelConfig) -> None:
        if "bad" in model.options:
            raise ConfigError("invalid", [(f"models.{model.name}.options.bad", "no good")])

    class Backends:
        @hookimpl
        def servehall_register_backends(self, registry: BackendRegistry) -> None:
            probe = lambda: ProbeResult(True, "here")  # noqa: E731
            registry.add(BackendSpec("strict", probe, factory=lambda m: None, check_options=check))
            registry.add(BackendSpec("lax", probe, factory=lambda m: None))

    host = PluginHost([], extra=[("b", Backends())])
    models = [
        {"name": n, "path": "/tmp", "backend": b, "options": o}
        for n, b, o in [("a", "strict", {"bad": 1}), ("b", "strict", {}), ("c", "lax", {"bad": 1})]
    ]
    with pytest.raises(ConfigError) as err:
        check_names(load_settings(data={"models": models}), host)
    assert err.value.errors == [("models.a.options.bad", "no good")]


# --- typed calls: authenticate, authorize, settings sections, migration branches ---------


def test_authenticate_takes_the_first_principal_and_closes_the_rest() -> None:
    import asyncio

    from pydantic import BaseModel

    from servehall import Principal, hookimpl

    ran: list[str] = []

    class Sync:
        @hookimpl
        def servehall_authenticate(self, request: object) -> None:
            ran.append("sync")
            return None

    class First:
        @hookimpl
        async def servehall_authenticate(self, request: object) -> Principal:
            ran.append("first")
            return Principal(id="p1")

    class Later:
        @hookimpl
        async def servehall_authenticate(self, request: object) -> Principal:
            ran.append("later")  # never runs: its coroutine is closed unawaited
            return Principal(id="p2")

    host = PluginHost([], extra=[("sync", Sync()), ("first", First()), ("later", Later())])
    assert host.has_authenticators
    got = asyncio.run(host.authenticate(None, None))  # type: ignore[arg-type]
    assert got is not None and got.id == "p1"
    assert ran == ["sync", "first"]
    assert not PluginHost([]).has_authenticators
    assert asyncio.run(PluginHost([]).authenticate(None, None)) is None  # type: ignore[arg-type]

    class Section(BaseModel):
        x: int = 1

    class Claims:
        def __init__(self, section: str) -> None:
            self.section = section

        @hookimpl
        def servehall_settings_models(self) -> list[tuple[str, type[BaseModel]]]:
            return [(self.section, Section)]

    ok = PluginHost([], extra=[("a", Claims("alpha")), ("b", Claims("beta"))])
    assert ok.settings_models() == {"alpha": Section, "beta": Section}
    clash = PluginHost([], extra=[("a", Claims("alpha")), ("b", Claims("alpha"))])
    with pytest.raises(PluginError, match="config section 'alpha' claimed by two plugins"):
        clash.settings_models()


def test_authorize_releases_what_was_reserved_when_a_later_plugin_refuses() -> None:
    import asyncio

    from servehall import hookimpl
    from servehall.errors import RateLimitError

    released: list[str] = []

    class Held:
        def __init__(self, name: str) -> None:
            self.name = name

        async def settle(self, prompt_tokens: int, completion_tokens: int) -> None:
            pass

        async def release(self) -> None:
            released.append(self.name)

        def headers(self) -> dict[str, str]:
            return {}

    class Reserve:
        def __init__(self, name: str) -> None:
            self.name = name

        @hookimpl
        async def servehall_authorize(self, admission: object) -> Held:
            return Held(self.name)

    class Nothing:
        @hookimpl
        def servehall_authorize(self, admission: object) -> None:
            return None

    ok = PluginHost([], extra=[("a", Reserve("a")), ("n", Nothing()), ("b", Reserve("b"))])
    held = asyncio.run(ok.authorize(None, None))  # type: ignore[arg-type]
    assert [h.name for h in held] == ["a", "b"]  # type: ignore[attr-defined]

    class RefuseLate:
        @hookimpl
        async def servehall_authorize(self, admission: object) -> None:
            raise RateLimitError("over quota")

    late = PluginHost([], extra=[("a", Reserve("a")), ("r", RefuseLate()), ("c", Reserve("c"))])
    with pytest.raises(RateLimitError):
        asyncio.run(late.authorize(None, None))  # type: ignore[arg-type]
    assert released == ["a"]


def test_a_plugin_migration_hook_must_return_its_own_branch() -> None:
    from servehall import MigrationBranch, hookimpl

    class Own:
        @hookimpl
        def servehall_migrations(self) -> list[MigrationBranch]:
            return [MigrationBranch("own", "servehall:migrations")]

    class Wrong:
        @hookimpl
        def servehall_migrations(self) -> list[MigrationBranch]:
            return [MigrationBranch("someone_else", "servehall:migrations")]

    assert [b.label for b in PluginHost([], extra=[("own", Own())]).migrations()] == ["own"]
    with pytest.raises(
        PluginError, match="plugin 'wrong': servehall_migrations returned no branch"
    ):
        PluginHost([], extra=[("wrong", Wrong())]).migrations()
