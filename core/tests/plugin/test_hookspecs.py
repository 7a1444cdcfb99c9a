"""One test per hook (``test_hook_<name>``): the host calls each hook with the documented
arguments and semantics. ``test_hooks_meta.py`` checks every hook has such a test."""

from __future__ import annotations

from typing import Any

import pytest
import typer
from pydantic import BaseModel
from starlette.routing import Route
from typer.testing import CliRunner

from servehall import (
    ANONYMOUS,
    AdmissionRequest,
    AuthenticationError,
    BackendSpec,
    FilterVerdict,
    MigrationBranch,
    PluginError,
    Principal,
    ProbeResult,
    RateLimitError,
    SchedulerSpec,
    SinkSpec,
    StreamFilterResult,
    hookimpl,
)
from servehall.config import load_settings, validate_plugin_sections
from servehall.errors import ConfigError
from servehall.plugin.host import Host
from servehall.plugin.manager import PluginHost
from servehall.plugin.registries import RouteRegistry


def _host(*plugins: object) -> PluginHost:
    return PluginHost([], extra=[(f"p{i}", p) for i, p in enumerate(plugins)])


def _admission(**kw: Any) -> AdmissionRequest:
    base: dict[str, Any] = dict(
        request_id="r1",
        endpoint="/v1/completions",
        model="m",
        principal=ANONYMOUS,
        prompt_tokens=10,
        max_tokens=5,
        n=2,
    )
    base.update(kw)
    return AdmissionRequest(**base)


def test_hook_register_backends() -> None:
    class P:
        @hookimpl
        def servehall_register_backends(self, registry: Any) -> None:
            registry.add(BackendSpec("x", lambda: ProbeResult(True, "ok"), lambda m: None))

    reg = _host(P()).backends()
    assert "x" in reg.names() and reg.select("x").name == "x"


def test_hook_register_schedulers() -> None:
    class P:
        @hookimpl
        def servehall_register_schedulers(self, registry: Any) -> None:
            registry.add(SchedulerSpec("lifo", lambda settings: None))

    assert {"fcfs", "lifo"} <= set(_host(P()).schedulers().names())


def test_hook_register_tool_parsers() -> None:
    from servehall import CallFormat, ToolParser

    fmt = CallFormat("<function_call>", "</function_call>", ("args",))
    xml = ToolParser(
        "xmlish",
        fmt,
        "<function_call>",
        '<function_call>{"name": {name}, "args": ',
        "}</function_call>",
    )

    class P:
        @hookimpl
        def servehall_register_tool_parsers(self, registry: Any) -> None:
            registry.add(xml)

    reg = _host(P()).tool_parsers()
    assert {"hermes", "llama3_json", "xmlish"} <= set(reg.names())
    stream = reg.get("xmlish").stream(lambda: "call_1")
    out = stream.feed('Hi <function_call>{"name": "f", "args": {"a": 1}}</function_call>')
    tail = stream.finish()
    assert out.content + tail.content == "Hi"
    assert [(d.id, d.name, d.arguments) for d in out.calls + tail.calls] == [
        ("call_1", "f", ""),
        (None, None, '{"a": 1}'),
    ]
    with pytest.raises(ConfigError, match="unknown tool parser 'nope'; known: hermes"):
        reg.get("nope")

    class Twice:
        @hookimpl
        def servehall_register_tool_parsers(self, registry: Any) -> None:
            registry.add(xml)

    with pytest.raises(ConfigError, match="registered twice"):
        _host(P(), Twice()).tool_parsers()


async def test_hook_authenticate() -> None:
    calls: list[str] = []

    class Abstains:
        @hookimpl
        async def servehall_authenticate(self, request: Any) -> None:
            calls.append("abstains")
            return None

    class Knows:
        @hookimpl
        async def servehall_authenticate(self, host: Any, request: Any) -> Principal:
            calls.append("knows")
            return Principal(id="k1", tenant="t")

    host = _host(Abstains(), Knows())
    assert host.has_authenticators
    principal = await host.authenticate(None, None)  # type: ignore[arg-type]
    assert principal is not None and principal.id == "k1"
    assert calls == ["abstains", "knows"]  # chain (registration) order, awaited

    class Late:
        @hookimpl
        async def servehall_authenticate(self) -> None:
            calls.append("late")

    calls.clear()
    assert (await _host(Knows(), Late()).authenticate(None, None)).id == "k1"  # type: ignore[arg-type, union-attr]
    assert calls == ["knows"]  # the first principal wins; later coroutines never run

    class Rejects:
        @hookimpl
        async def servehall_authenticate(self, request: Any) -> None:
            raise AuthenticationError("bad key")

    with pytest.raises(AuthenticationError):
        await _host(Rejects()).authenticate(None, None)  # type: ignore[arg-type]
    assert not _host().has_authenticators


async def test_hook_authorize() -> None:
    events: list[str] = []

    class Res:
        def __init__(self, name: str) -> None:
            self.name = name

        async def settle(self, prompt_tokens: int, completion_tokens: int) -> None:
            events.append(f"settle {self.name}")

        async def release(self) -> None:
            events.append(f"release {self.name}")

        def headers(self) -> dict[str, str]:
            return {}

    class Grants:
        @hookimpl
        async def servehall_authorize(self, admission: AdmissionRequest) -> Res:
            assert admission.token_estimate == 20  # prompt 10 + max_tokens 5 x n 2
            return Res("a")

    class Limits:
        @hookimpl
        async def servehall_authorize(self, admission: AdmissionRequest) -> None:
            raise RateLimitError("slow down", headers={"Retry-After": "3"})

    held = await _host(Grants()).authorize(None, _admission())  # type: ignore[arg-type]
    assert len(held) == 1
    with pytest.raises(RateLimitError):
        await _host(Grants(), Limits()).authorize(None, _admission())  # type: ignore[arg-type]
    assert events == ["release a"]  # what was reserved before the refusal is released


def test_hook_input_filters() -> None:
    class F:
        name = "f"

        def check(self, prompt: Any) -> list[FilterVerdict]:
            return []

    class P:
        @hookimpl
        def servehall_input_filters(self, host: Any) -> list[F]:
            return [F()]

    class Q:
        @hookimpl
        def servehall_input_filters(self) -> None:
            return None

    assert [f.name for f in _host(P(), Q()).input_filters(None)] == ["f"]  # type: ignore[arg-type]


def test_hook_output_filters() -> None:
    made: list[str] = []

    class SF:
        def feed(self, text: str) -> StreamFilterResult:
            return StreamFilterResult(text)

        def finish(self) -> StreamFilterResult:
            return StreamFilterResult("")

    class P:
        @hookimpl
        def servehall_output_filters(self, admission: AdmissionRequest) -> list[SF]:
            made.append(admission.request_id)
            return [SF()]

    host = _host(P())
    assert host.has_output_filters and not _host().has_output_filters
    a = host.output_filters(None, _admission())  # type: ignore[arg-type]
    b = host.output_filters(None, _admission())  # type: ignore[arg-type]
    assert len(a) == 1 and a[0] is not b[0]  # fresh per call (per choice)
    assert made == ["r1", "r1"]


def test_hook_register_sinks() -> None:
    class P:
        @hookimpl
        def servehall_register_sinks(self, registry: Any) -> None:
            registry.add(SinkSpec("null", lambda options, settings: None))

    assert "null" in _host(P()).sinks().names()


def test_hook_settings_models() -> None:
    class Section(BaseModel):
        level: int = 1

    class P:
        @hookimpl
        def servehall_settings_models(self) -> list[tuple[str, type[BaseModel]]]:
            return [("myplug", Section)]

    models = _host(P()).settings_models()
    settings = load_settings(data={"myplug": {"level": 3}})
    validate_plugin_sections(settings, models)
    assert settings.section("myplug").level == 3
    bad = load_settings(data={"myplug": {"level": "high"}, "other": {}})
    with pytest.raises(ConfigError) as err:
        validate_plugin_sections(bad, models)
    keys = [k for k, _ in err.value.errors]
    assert "myplug.level" in keys and "other" in keys


async def test_hook_startup() -> None:
    seen: list[str] = []

    class P:
        @hookimpl
        async def servehall_startup(self, host: Host) -> None:
            seen.append("async")

    class Q:
        @hookimpl
        def servehall_startup(self, host: Host) -> None:
            seen.append("sync")

    plugins = _host(P(), Q())
    await plugins.startup(Host(settings=load_settings(data={}), plugins=plugins))
    # pluggy calls both in chain order: the sync body runs during the call, the async
    # one's coroutine is awaited afterwards (docs/hooks.md, "Order")
    assert seen == ["sync", "async"]


async def test_hook_shutdown() -> None:
    seen: list[Host] = []

    class P:
        @hookimpl
        async def servehall_shutdown(self, host: Host) -> None:
            seen.append(host)

    plugins = _host(P())
    host = Host(settings=load_settings(data={}), plugins=plugins)
    await plugins.shutdown(host)
    assert seen == [host]


def test_hook_register_routes() -> None:
    async def hello(request: Any) -> None:
        return None

    class P:
        @hookimpl
        def servehall_register_routes(self, router: RouteRegistry) -> None:
            router.add(Route("/admin/hello", hello))

    router = RouteRegistry()
    _host(P()).routes(None, router)  # type: ignore[arg-type]
    assert [r.path for r in router.routes] == ["/admin/hello"]  # type: ignore[attr-defined]


def test_hook_register_commands() -> None:
    class P:
        @hookimpl
        def servehall_register_commands(self, cli: typer.Typer) -> None:
            @cli.command("hello")
            def hello() -> None:
                typer.echo("hello from a plugin")

    cli = typer.Typer()
    _host(P()).commands(cli)
    result = CliRunner().invoke(cli, ["hello"])
    assert result.exit_code == 0 and "hello from a plugin" in result.output


def test_hook_migrations(tmp_path: Any) -> None:
    class P:
        @hookimpl
        def servehall_migrations(self) -> list[MigrationBranch]:
            return [MigrationBranch("p0", tmp_path)]

    assert [b.label for b in _host(P()).migrations()] == ["p0"]

    class Wrong:
        @hookimpl
        def servehall_migrations(self) -> list[MigrationBranch]:
            return [MigrationBranch("someone_else", tmp_path)]

    with pytest.raises(PluginError, match="plugin 'p0': servehall_migrations returned no branch"):
        _host(Wrong()).migrations()
