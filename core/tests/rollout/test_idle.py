"""``servehall.rollout.idle``: the idle sweep (which versions turn ``unloaded``, their
engine stopped and ``on_stop`` run) and :func:`load_on_demand` on a real engine (the
``null`` backend on the demo model, on a thread): one shared load, a 503
``queue_timeout`` while it takes too long (the load goes on), a 503 when it fails."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from servehall.config.models import GateSettings
from servehall.config.settings import Settings, load_settings
from servehall.errors import EngineUnavailableError, QueueTimeoutError
from servehall.host.versions import start_version, stop_engine
from servehall.plugin.host import Host, ServedModel
from servehall.plugin.manager import PluginHost
from servehall.rollout.idle import IdleUnloader, load_on_demand


@pytest.fixture(scope="module")
def model_dir() -> Path:
    from servehall.demo import build_demo_model, default_demo_dir

    return Path(build_demo_model(default_demo_dir()))


def _settings(path: Path | str, idle: float | None = 30.0, **scheduler: Any) -> Settings:
    model: dict[str, Any] = {
        "name": "m",
        "path": str(path),
        "backend": "null",
        "isolation": "thread",
    }
    if idle is not None:
        model["idle_unload_s"] = idle
    return load_settings(data={"models": [model], "scheduler": scheduler})


async def _host(settings: Settings) -> tuple[Host, ServedModel]:
    host = Host(settings=settings, plugins=PluginHost([]))
    served = await start_version(host, settings.models[0])
    host.models[served.key] = served
    return host, served


async def test_sweep_unloads_only_idle_serving_versions(model_dir: Path) -> None:
    host, served = await _host(_settings(model_dir, idle=30))
    stopped: list[str] = []
    served.on_stop.append(lambda: stopped.append("lease"))
    try:
        unloader = IdleUnloader(host)
        t = served.last_used
        assert await unloader.sweep(t + 29) == []
        served.inflight = 1
        assert await unloader.sweep(t + 31) == []  # a request in flight
        served.inflight = 0
        served.state = "draining"
        assert await unloader.sweep(t + 31) == []
        served.state = "serving"
        assert await unloader.sweep(t + 31) == ["m"]
        assert served.state == "unloaded" and stopped == ["lease"]
        assert await unloader.sweep(t + 1000) == []  # already unloaded
    finally:
        await stop_engine(served)


async def test_no_idle_unload_s_never_unloads(model_dir: Path) -> None:
    host, served = await _host(_settings(model_dir, idle=None))
    try:
        assert await IdleUnloader(host).sweep(time.monotonic() + 1e9) == []
        assert served.state == "serving"
    finally:
        await stop_engine(served)


async def test_load_on_demand_shares_one_load(model_dir: Path) -> None:
    host, served = await _host(_settings(model_dir))
    try:
        await IdleUnloader(host).sweep(served.last_used + 31)
        old_engine = served.engine
        await asyncio.gather(load_on_demand(host, served), load_on_demand(host, served))
        assert served.state == "serving" and served.loads == 2  # start + one reload
        assert served.engine is not old_engine and served.last_load_s > 0
        assert served.load_task is not None and served.load_task.done()
        assert (await served.engine.health()).ok
    finally:
        await stop_engine(served)


async def test_slow_load_is_a_queue_timeout_and_goes_on(model_dir: Path, tmp_path: Path) -> None:
    # A load that takes a while: a gate whose one answer takes a 50 ms engine step.
    golden = tmp_path / "g.jsonl"
    golden.write_text('{"prompt": "the cat", "reference": "x"}\n')
    settings = _settings(model_dir, queue_timeout_s=0.001, retry_after_s=4)
    settings.models[0] = settings.models[0].model_copy(
        update={
            "options": {"step_time_ms": 50},
            "gate": GateSettings(golden=golden, min=0, max_tokens=1),
        }
    )
    host, served = await _host(settings)
    try:
        await IdleUnloader(host).sweep(served.last_used + 31)
        with pytest.raises(QueueTimeoutError) as info:
            await load_on_demand(host, served)
        assert info.value.headers == {"Retry-After": "4"}
        assert "is loading after being idle" in info.value.message
        task = served.load_task
        assert task is not None
        await task  # the load was not cancelled with the request
        assert served.state == "serving" and served.loads == 2
    finally:
        await stop_engine(served)


async def test_failed_load_is_a_503_and_the_next_request_tries_again(
    model_dir: Path, tmp_path: Path
) -> None:
    moved = tmp_path / "model"
    moved.symlink_to(model_dir)
    host, served = await _host(_settings(moved))
    try:
        await IdleUnloader(host).sweep(served.last_used + 31)
        moved.unlink()
        with pytest.raises(EngineUnavailableError) as info:
            await load_on_demand(host, served)
        assert info.value.message.startswith("Model `m` could not be loaded: ")
        assert served.state == "unloaded" and served.loads == 1
        moved.symlink_to(model_dir)
        await load_on_demand(host, served)
        assert served.state == "serving" and served.loads == 2
    finally:
        await stop_engine(served)


async def test_start_and_stop_the_background_check(model_dir: Path) -> None:
    host, served = await _host(_settings(model_dir, idle=0.01))
    try:
        unloader = IdleUnloader(host, interval_s=0.01)
        unloader.start()
        unloader.start()
        for _ in range(100):
            await asyncio.sleep(0.01)
            if served.state == "unloaded":
                break
        assert served.state == "unloaded"
        await unloader.stop()
        await unloader.stop()
    finally:
        await stop_engine(served)
