"""``servehall.host.versions`` on the ``null`` backend (the demo model's files, engines on
a thread): build a host's versions, the startup errors (no models, a key configured
twice, not a model directory, unknown backend or tool parser, a tool-call grammar the
engine cannot compile), engines stopped with
their ``on_stop`` callbacks, and an unstarted worker engine for process isolation."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from servehall.config.settings import Settings, load_settings
from servehall.errors import ConfigError
from servehall.host.versions import (
    build_host,
    make_engine,
    pull_source,
    shutdown_host,
    start_version,
    stop_engine,
)
from servehall.plugin.host import Host
from servehall.plugin.manager import PluginHost
from servehall.worker.client import ProcessEngine


@pytest.fixture(scope="module")
def model_dir() -> Path:
    from servehall.demo import build_demo_model, default_demo_dir

    return Path(build_demo_model(default_demo_dir()))


def _settings(*models: dict[str, Any]) -> Settings:
    return load_settings(
        data={
            "sinks": [],
            "models": [
                {"name": "m", "backend": "null", "isolation": "thread", **m} for m in models
            ],
        }
    )


async def test_build_host_starts_every_version(model_dir: Path) -> None:
    settings = _settings(
        {"path": str(model_dir), "version": "a", "max_model_len": 64},
        {"path": str(model_dir), "version": "b", "weight": 0},
    )
    host = await build_host(settings, PluginHost([]))
    try:
        assert sorted(host.models) == ["m@a", "m@b"]
        a, b = host.models["m@a"], host.models["m@b"]
        assert (a.backend, a.state, a.loads, a.version, a.weight) == (
            "null",
            "serving",
            1,
            "a",
            1.0,
        )
        assert a.max_model_len == 64 and b.max_model_len >= 64
        assert b.weight == 0 and a.config is settings.models[0]
        assert a.scheduler.name == settings.scheduler.policy
        assert (await a.engine.health()).ok
        assert host.records is not None and host.input_filters == []
    finally:
        await shutdown_host(host)


async def test_no_models_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"no \[\[models\]\] configured"):
        await build_host(load_settings(data={"sinks": []}), PluginHost([]))


async def test_a_key_configured_twice_stops_what_started(model_dir: Path) -> None:
    settings = _settings({"path": str(model_dir)}, {"path": str(model_dir)})
    with pytest.raises(ConfigError, match="model 'm' configured twice"):
        await build_host(settings, PluginHost([]))


@pytest.mark.parametrize(
    ("model", "message"),
    [
        ({"backend": "no_such_backend"}, "no_such_backend"),
        ({"tool_parser": "nope"}, "models.m.tool_parser"),
        # the null engine compiles no structural tags (nor any constraint)
        ({"tool_call_grammar": "always"}, "models.m.tool_call_grammar: 'always' needs"),
    ],
)
async def test_start_version_errors(model_dir: Path, model: dict[str, Any], message: str) -> None:
    settings = _settings({"path": str(model_dir), **model})
    host = Host(settings=settings, plugins=PluginHost([]))
    with pytest.raises(ConfigError, match=message):
        await start_version(host, settings.models[0])


async def test_a_path_that_is_not_a_model_directory(tmp_path: Path) -> None:
    settings = _settings({"path": str(tmp_path)})
    host = Host(settings=settings, plugins=PluginHost([]))
    with pytest.raises(ConfigError) as info:
        await start_version(host, settings.models[0])
    assert str(tmp_path) in info.value.message


async def test_local_paths_are_not_pulled(model_dir: Path) -> None:
    settings = _settings({"path": str(model_dir)})
    host = Host(settings=settings, plugins=PluginHost([]))
    mc = settings.models[0]
    assert await pull_source(host, mc) == (mc, None)
    assert host.pulls == {}


async def test_stop_engine_runs_callbacks_even_when_one_fails(model_dir: Path) -> None:
    settings = _settings({"path": str(model_dir)})
    host = Host(settings=settings, plugins=PluginHost([]))
    served = await start_version(host, settings.models[0])
    ran: list[str] = []

    def boom() -> None:
        ran.append("boom")
        raise RuntimeError("lease gone")

    served.on_stop.extend([lambda: ran.append("first"), boom, lambda: ran.append("last")])
    await stop_engine(served)
    assert ran == ["last", "boom", "first"] and served.on_stop == []
    await stop_engine(served)  # a second stop: nothing left to run, no error
    assert ran == ["last", "boom", "first"]


async def test_process_isolation_makes_an_unstarted_worker_engine(model_dir: Path) -> None:
    settings = load_settings(
        data={"sinks": [], "models": [{"name": "m", "path": str(model_dir), "backend": "null"}]}
    )
    host = Host(settings=settings, plugins=PluginHost([]))
    spec = host.plugins.backends().select("null")
    from servehall.text.tokenizer import load_tokenizer

    engine = make_engine(host, settings.models[0], spec, load_tokenizer(model_dir))
    assert isinstance(engine, ProcessEngine)
    thread = make_engine(
        host,
        settings.models[0].model_copy(update={"isolation": "thread"}),
        spec,
        load_tokenizer(model_dir),
    )
    assert not isinstance(thread, ProcessEngine) and thread.backend == "null"
