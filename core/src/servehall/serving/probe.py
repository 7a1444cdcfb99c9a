"""Readiness: a model is ready when its engine is healthy and a one-token probe inference
(or a real request) succeeded recently. With versions (docs/versions.md) each version is
reported under its key (``name@version``); the replica is ready while every served name
has at least one ready version.

:class:`Readiness` runs the probe at startup and again whenever the last success is
older than ``probe_interval_s``; ``/health/ready`` answers 200 only while every model has
succeeded within ``max_age_s`` and every ``required`` record sink can record (a sink
that cannot is named under ``sinks`` with its reason, so a load balancer sends traffic
to another replica instead of into fail-closed 503s).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from servehall.engines.contract import EngineHealth, SamplingParams

if TYPE_CHECKING:
    from servehall.plugin.host import Host, ServedModel

log = logging.getLogger("servehall.health")

_STATE_REASONS = {
    "unloaded": "unloaded, loads on demand",
    "loading": "loading (a config change: no traffic until its probe passes)",
    "draining": "draining (removed by a config change)",
}
_ids = itertools.count()


class Readiness:
    """Probe bookkeeping for every model of a host."""

    def __init__(
        self,
        host: Host,
        probe_interval_s: float = 10.0,
        max_age_s: float = 60.0,
        probe_timeout_s: float = 30.0,
    ) -> None:
        self.host = host
        self.probe_interval_s = probe_interval_s
        self.max_age_s = max_age_s
        self.probe_timeout_s = probe_timeout_s
        self.last_ok: dict[str, float] = {}
        self.last_error: dict[str, str] = {}
        self.config_report: Callable[[], dict[str, Any]] | None = None
        self._task: asyncio.Task[None] | None = None

    def mark_ok(self, model: str) -> None:
        """A real request on ``model`` succeeded (counts as a probe)."""
        self.last_ok[model] = time.monotonic()
        self.last_error.pop(model, None)

    async def probe(self, served: ServedModel) -> bool:
        """Run one greedy one-token inference on ``served``; record the outcome."""
        tok = served.tokenizer
        prompt = tok.encode_plain("ready", add_special_tokens=True) or [0]
        rid = f"probe-{next(_ids)}"
        if served.config is not None and served.config.task == "embed":
            return await self._probe_embed(served, prompt)
        stream: Any = served.engine.add_request(
            rid, prompt, SamplingParams(max_tokens=1, temperature=0.0)
        )
        try:
            async with asyncio.timeout(self.probe_timeout_s):
                async for delta in stream:
                    if delta.finish_reason == "error":
                        raise RuntimeError(delta.error or "engine error")
                    if delta.finish_reason is not None:
                        break
        except Exception as exc:
            self.last_error[served.key] = f"{type(exc).__name__}: {exc}"[:300]
            log.warning("readiness probe of %s failed: %s", served.key, exc)
            with contextlib.suppress(Exception):
                await served.engine.abort(rid)
            return False
        finally:
            with contextlib.suppress(Exception):
                await stream.aclose()
        self.mark_ok(served.key)
        return True

    async def _probe_embed(self, served: ServedModel, prompt: list[int]) -> bool:
        """The probe of an embedding model: one embedding of ``prompt``."""
        try:
            async with asyncio.timeout(self.probe_timeout_s):
                await served.engine.embed([prompt])  # type: ignore[attr-defined]
        except Exception as exc:
            self.last_error[served.key] = f"{type(exc).__name__}: {exc}"[:300]
            log.warning("readiness probe of %s failed: %s", served.key, exc)
            return False
        self.mark_ok(served.key)
        return True

    async def probe_all(self) -> None:
        for served in list(self.host.models.values()):
            if served.state != "serving":
                continue
            age = time.monotonic() - self.last_ok.get(served.key, float("-inf"))
            if age >= self.probe_interval_s:
                await self.probe(served)

    async def _loop(self) -> None:
        while True:
            await self.probe_all()
            await asyncio.sleep(max(1.0, self.probe_interval_s / 2))

    def start(self) -> None:
        """Start the background probe loop (on the running event loop)."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._loop())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def report(self) -> tuple[bool, dict[str, Any]]:
        """``(ready, body)`` for ``/health/ready``; the body includes engine stats."""
        now = time.monotonic()
        models: dict[str, Any] = {}
        names_ok: dict[str, bool] = {}
        for name, served in list(self.host.models.items()):
            if served.state == "removed":
                continue
            try:
                health = await served.engine.health()
            except Exception as exc:  # a failing health check means "not ready", not a 500
                health = EngineHealth(False, f"health check raised {type(exc).__name__}")
            age = now - self.last_ok[name] if name in self.last_ok else None
            ok = health.ok and age is not None and age <= self.max_age_s
            if served.state != "serving":
                ok = False
                health = EngineHealth(False, _STATE_REASONS.get(served.state, served.state))
            # an idle-unloaded version loads on demand: it keeps the replica ready
            usable = ok or served.state == "unloaded"
            names_ok[served.name] = names_ok.get(served.name, False) or usable
            s = served.engine.stats()
            models[name] = {
                "ready": ok,
                "state": served.state,
                "backend": served.backend,
                **({"model": served.name, "version": served.version} if served.version else {}),
                "reason": ""
                if ok
                else (health.reason or self.last_error.get(name) or "no successful probe yet"),
                "last_probe_age_s": None if age is None else round(age, 3),
                "engine": {
                    "running": s.running,
                    "waiting": s.waiting,
                    "kv_cache_blocks_used": s.kv_cache_blocks_used,
                    "kv_cache_blocks_total": s.kv_cache_blocks_total,
                },
                "scheduler": scheduler_report(served.scheduler),
            }
        # ready while every served name has a ready version (a loading canary or a
        # draining version does not turn the replica unready)
        ready = bool(names_ok) and all(names_ok.values())
        body: dict[str, Any] = {"models": models}
        pulls = dict(self.host.pulls)  # versions whose files are being pulled (a URL path)
        for key, where in pulls.items():
            if key in models and not models[key]["ready"]:
                models[key]["reason"] = where
        if pulls:
            body["pulls"] = pulls
        if self.config_report is not None:
            body["config"] = self.config_report()
        unready_sinks = getattr(self.host.records, "unready_sinks", None)
        if unready_sinks is not None:
            unready = unready_sinks()
            if unready:
                ready = False
                body["sinks"] = {
                    name: {"ready": False, "required": True, "reason": reason}
                    for name, reason in unready.items()
                }
        return ready, {"status": "ready" if ready else "not_ready", **body}


def scheduler_report(scheduler: Any) -> dict[str, Any]:
    """The scheduler part of ``/health/ready``: policy, running, waiting, and how many
    tenants are waiting or running. No tenant names: the route needs no credential
    (per-tenant figures are in ``/metrics``)."""
    out: dict[str, Any] = {
        "policy": getattr(scheduler, "name", None),
        "running": scheduler.running,
        "waiting": scheduler.waiting,
    }
    tenant_states = getattr(scheduler, "tenant_states", None)
    if tenant_states is not None:
        states = tenant_states().values()
        out["tenants_waiting"] = sum(1 for t in states if t.waiting)
        out["tenants_running"] = sum(1 for t in states if t.running)
    return out
