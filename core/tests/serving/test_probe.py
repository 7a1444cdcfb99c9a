"""``servehall.serving.probe``: the one-token readiness probe (success, error delta,
timeout with abort, embedding models), ``probe_all``'s interval and states, and the
``/health/ready`` report (per-version readiness, a name ready while one version is,
unloaded versions, pulls, unready required sinks, scheduler figures without tenant
names)."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parents[1]))
from api_fixtures import Records, ScriptedEngine

from servehall.admission.scheduler import Ticket
from servehall.config.models import ModelConfig, SchedulerSettings
from servehall.config.settings import Settings
from servehall.engines.contract import EngineHealth, SamplingParams, TokenDelta
from servehall.plugin.host import Host, ServedModel
from servehall.plugin.manager import PluginHost
from servehall.schedulers.fair import FairScheduler
from servehall.schedulers.fcfs import FcfsScheduler
from servehall.serving.probe import Readiness, scheduler_report


class Tokenizer:
    """Just what the probe reads: ``encode_plain``."""

    def __init__(self, ids: list[int]) -> None:
        self.ids = ids

    def encode_plain(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return list(self.ids)


class FailingEngine(ScriptedEngine):
    def add_request(
        self, request_id: str, prompt_token_ids: Sequence[int], params: SamplingParams
    ) -> AsyncIterator[TokenDelta]:
        async def run() -> AsyncIterator[TokenDelta]:
            yield TokenDelta((), "error", "device lost")

        return run()


class HangingEngine(ScriptedEngine):
    def add_request(
        self, request_id: str, prompt_token_ids: Sequence[int], params: SamplingParams
    ) -> AsyncIterator[TokenDelta]:
        self.live.add(request_id)

        async def run() -> AsyncIterator[TokenDelta]:
            await asyncio.sleep(3600)
            yield TokenDelta((), "stop")

        return run()


class SickEngine(ScriptedEngine):
    async def health(self) -> EngineHealth:
        raise OSError("no device")


class EmbedEngine(ScriptedEngine):
    def __init__(self, fail: bool = False) -> None:
        super().__init__([1])
        self.fail = fail
        self.embedded: list[list[list[int]]] = []

    async def embed(self, prompts: list[list[int]]) -> list[list[float]]:
        self.embedded.append(prompts)
        if self.fail:
            raise RuntimeError("no pooling")
        return [[0.0]]


def _served(engine: Any, name: str = "m", version: str = "", **kw: Any) -> ServedModel:
    return ServedModel(
        name=name,
        backend="scripted",
        engine=engine,
        scheduler=FcfsScheduler(SchedulerSettings()),
        tokenizer=Tokenizer([5, 6]),
        max_model_len=256,
        version=version,
        **kw,
    )


def _host(*served: ServedModel) -> Host:
    host = Host(settings=Settings(), plugins=PluginHost([]))
    for s in served:
        host.models[s.key] = s
    host.records = Records()  # type: ignore[assignment]
    return host


async def test_probe_success_marks_ok_and_sends_one_greedy_token() -> None:
    engine = ScriptedEngine([1, 2, 3])
    served = _served(engine)
    r = Readiness(_host(served))
    assert await r.probe(served)
    assert "m" in r.last_ok and "m" not in r.last_error
    assert engine.prompts == [[5, 6]]
    assert engine.params[0].max_tokens == 1 and engine.params[0].temperature == 0.0


async def test_empty_prompt_probes_with_token_zero() -> None:
    engine = ScriptedEngine([1])
    served = _served(engine)
    served.tokenizer = Tokenizer([])
    assert await Readiness(_host(served)).probe(served)
    assert engine.prompts == [[0]]


async def test_probe_error_delta_is_recorded() -> None:
    served = _served(FailingEngine([1]))
    r = Readiness(_host(served))
    assert not await r.probe(served)
    assert r.last_error["m"] == "RuntimeError: device lost"
    assert "m" not in r.last_ok
    ready, body = await r.report()
    assert not ready and body["models"]["m"]["reason"] == "RuntimeError: device lost"


async def test_probe_timeout_aborts_the_request() -> None:
    engine = HangingEngine([1])
    served = _served(engine)
    r = Readiness(_host(served), probe_timeout_s=0.05)
    assert not await r.probe(served)
    assert r.last_error["m"].startswith("TimeoutError")
    assert len(engine.aborted) == 1 and engine.aborted[0].startswith("probe-")


async def test_embedding_model_probe() -> None:
    ok = EmbedEngine()
    served = _served(ok, config=ModelConfig(name="m", path="/m", task="embed"))
    r = Readiness(_host(served))
    assert await r.probe(served)
    assert ok.embedded == [[[5, 6]]] and ok.prompts == []
    bad = _served(EmbedEngine(fail=True), config=ModelConfig(name="m", path="/m", task="embed"))
    assert not await r.probe(bad)
    assert r.last_error["m"] == "RuntimeError: no pooling"


async def test_a_real_request_counts_as_a_probe_and_clears_the_error() -> None:
    served = _served(FailingEngine([1]))
    r = Readiness(_host(served))
    await r.probe(served)
    r.mark_ok("m")
    assert "m" not in r.last_error
    ready, body = await r.report()
    assert ready and body["status"] == "ready" and body["models"]["m"]["reason"] == ""


async def test_probe_all_respects_interval_and_state() -> None:
    serving = ScriptedEngine([1])
    loading = ScriptedEngine([1])
    a = _served(serving, version="a")
    b = _served(loading, version="b", state="loading")
    r = Readiness(_host(a, b), probe_interval_s=60)
    await r.probe_all()
    await r.probe_all()  # the first success is recent: not probed again
    assert len(serving.prompts) == 1 and loading.prompts == []
    r.last_ok["m@a"] = time.monotonic() - 61
    await r.probe_all()
    assert len(serving.prompts) == 2


async def test_report_is_ready_while_each_name_has_a_ready_version() -> None:
    old = _served(ScriptedEngine([1]), version="v1")
    canary = _served(ScriptedEngine([1]), version="v2", state="loading")
    other = _served(ScriptedEngine([1]), name="n")
    r = Readiness(_host(old, canary, other), max_age_s=60)
    ready, body = await r.report()
    assert not ready and body["models"]["n"]["reason"] == "no successful probe yet"
    assert body["models"]["n"]["last_probe_age_s"] is None
    r.mark_ok("m@v1")
    r.mark_ok("n")
    r.mark_ok("m@v2")  # a loading version is not ready, whatever its probes
    ready, body = await r.report()
    assert ready
    m2 = body["models"]["m@v2"]
    assert m2["ready"] is False and m2["state"] == "loading"
    assert m2["reason"].startswith("loading")
    assert (m2["model"], m2["version"]) == ("m", "v2")
    assert "model" not in body["models"]["n"]
    # A success older than max_age_s no longer counts.
    r.last_ok["n"] = time.monotonic() - 61
    ready, _ = await r.report()
    assert not ready


async def test_unloaded_version_keeps_the_name_ready_and_removed_is_hidden() -> None:
    idle = _served(ScriptedEngine([1]), state="unloaded")
    gone = _served(ScriptedEngine([1]), name="old", state="removed")
    r = Readiness(_host(idle, gone))
    ready, body = await r.report()
    assert ready and list(body["models"]) == ["m"]
    assert body["models"]["m"]["reason"] == "unloaded, loads on demand"


async def test_health_that_raises_is_not_ready_not_a_500() -> None:
    served = _served(SickEngine([1]))
    r = Readiness(_host(served))
    r.mark_ok("m")
    ready, body = await r.report()
    assert not ready and body["models"]["m"]["reason"] == "health check raised OSError"


async def test_pulls_config_and_unready_sinks() -> None:
    served = _served(ScriptedEngine([1]))
    host = _host(served)
    r = Readiness(host)
    host.pulls["m"] = "pulling 3/10 files"
    r.config_report = lambda: {"revision": 4}
    ready, body = await r.report()
    assert not ready
    assert body["pulls"] == {"m": "pulling 3/10 files"}
    assert body["models"]["m"]["reason"] == "pulling 3/10 files"
    assert body["config"] == {"revision": 4}
    host.pulls.clear()
    r.mark_ok("m")

    class DownSink(Records):
        def unready_sinks(self) -> dict[str, str]:
            return {"sql": "database unreachable"}

    host.records = DownSink()  # type: ignore[assignment]
    ready, body = await r.report()
    assert not ready and body["status"] == "not_ready"
    assert body["sinks"] == {
        "sql": {"ready": False, "required": True, "reason": "database unreachable"}
    }


async def test_scheduler_report_counts_tenants_without_names() -> None:
    fair = FairScheduler(SchedulerSettings(max_concurrency=1))
    held = await fair.acquire(Ticket(request_id="a", model="m", tenant="secret-tenant"))
    waiting = asyncio.ensure_future(fair.acquire(Ticket(request_id="b", model="m", tenant="t2")))
    await asyncio.sleep(0)
    report = scheduler_report(fair)
    assert report == {
        "policy": "fair",
        "running": 1,
        "waiting": 1,
        "tenants_waiting": 1,
        "tenants_running": 1,
    }
    assert "secret-tenant" not in str(report)
    waiting.cancel()
    held.release()
    fcfs = scheduler_report(FcfsScheduler(SchedulerSettings()))
    assert fcfs["policy"] == "fcfs" and fcfs["running"] == 0


async def test_start_and_stop_the_loop() -> None:
    engine = ScriptedEngine([1])
    r = Readiness(_host(_served(engine)), probe_interval_s=10)
    r.start()
    r.start()  # once
    for _ in range(20):
        await asyncio.sleep(0.01)
        if engine.prompts:
            break
    assert len(engine.prompts) == 1
    await r.stop()
    assert r._task is None
    await r.stop()
