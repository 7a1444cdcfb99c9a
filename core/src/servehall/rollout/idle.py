"""Idle models give their memory back: ``[[models]] idle_unload_s``.

:class:`IdleUnloader` checks every second: a version in state ``serving`` with no
request in flight and none started for ``idle_unload_s`` seconds turns ``unloaded``
and its engine (the worker process and the model's memory) stops. It stays listed in
``/v1/models``, the router still gives it its share, and ``/health/ready`` says
"unloaded, loads on demand" without turning the replica unready. The next request
routed to it starts the engine again (:func:`load_on_demand`; concurrent requests share
one load) and waits like a queued request: longer than ``[scheduler] queue_timeout_s``
is a 503 ``queue_timeout`` with ``Retry-After`` (the load goes on for later requests).
A version with a ``gate`` runs it again on reload; a failure is a 503 and, when
another version of the name has weight, sets its weight to 0 like the canary guard.
``servehall_model_loads_total``, ``servehall_model_load_seconds`` and
``servehall_model_state`` report loads and states per version.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import TYPE_CHECKING

from servehall.errors import EngineUnavailableError, QueueTimeoutError

if TYPE_CHECKING:
    from servehall.host.gate import GateFailed
    from servehall.plugin.host import Host, ServedModel

log = logging.getLogger("servehall.rollout")


async def load_on_demand(host: Host, served: ServedModel) -> None:
    """Wait until ``served`` (state ``unloaded``) is loaded again, starting the load if
    no request did yet.

    Raises:
        QueueTimeoutError: not loaded within ``[scheduler] queue_timeout_s`` (503 with
            ``Retry-After``; the load continues).
        EngineUnavailableError: the load failed (503).
    """
    task = served.load_task
    if task is None or task.done():
        task = served.load_task = asyncio.get_running_loop().create_task(_load(host, served))
    timeout = host.settings.scheduler.queue_timeout_s
    try:
        async with asyncio.timeout(timeout):
            await asyncio.shield(task)
    except TimeoutError:
        retry = str(max(1, host.settings.scheduler.retry_after_s))
        raise QueueTimeoutError(
            f"Model `{served.name}` is loading after being idle; retry later.",
            headers={"Retry-After": retry},
        ) from None
    except Exception as exc:
        raise EngineUnavailableError(
            f"Model `{served.name}` could not be loaded: {getattr(exc, 'message', exc)}"
        ) from None


def _gate_rollback(host: Host, served: ServedModel, exc: GateFailed) -> None:
    """A reload failed its accuracy gate: when another version of the name has weight,
    take this one out of rotation like a canary the guard rolled back (weight 0, stored
    by :attr:`Host.on_canary_rollback` with reason ``gate`` and the figures)."""
    from servehall.plugin.outcomes import Breach

    others = [
        s for s in host.models.values() if s.name == served.name and s is not served and s.weight
    ]
    if not others or served.weight == 0:
        return
    served.weight = 0
    log.error("model %s: accuracy gate failed on reload; weight 0", served.key)
    if host.on_canary_rollback is not None:
        host.on_canary_rollback(
            served, Breach(reason="gate", detail=exc.message, figures=exc.report.figures())
        )


async def _load(host: Host, served: ServedModel) -> None:
    from servehall.host.gate import GateFailed
    from servehall.host.versions import start_version

    assert served.config is not None
    t0 = time.monotonic()
    log.info("model %s: loading on demand", served.key)
    try:
        fresh = await start_version(host, served.config)
    except GateFailed as exc:
        _gate_rollback(host, served, exc)
        raise
    served.engine, served.scheduler = fresh.engine, fresh.scheduler
    served.tokenizer, served.max_model_len = fresh.tokenizer, fresh.max_model_len
    served.on_stop.extend(fresh.on_stop)  # the fresh start's cache lease, if pulled
    served.loads += 1
    served.last_load_s = time.monotonic() - t0
    served.last_used = time.monotonic()
    if served.state == "unloaded":
        served.state = "serving"
    log.info("model %s: loaded in %.2f s", served.key, served.last_load_s)


class IdleUnloader:
    """The background check of ``idle_unload_s`` (see the module docstring)."""

    def __init__(self, host: Host, interval_s: float = 1.0) -> None:
        self.host = host
        self.interval_s = interval_s
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Start checking (on the running loop)."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._loop())

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            await self.sweep(time.monotonic())

    async def sweep(self, now: float) -> list[str]:
        """Unload every idle version; returns their keys."""
        from servehall.host.versions import stop_engine

        done = []
        for served in list(self.host.models.values()):
            idle = served.config.idle_unload_s if served.config is not None else None
            if idle is None or served.state != "serving" or served.inflight:
                continue
            if now - served.last_used < idle:
                continue
            served.state = "unloaded"
            done.append(served.key)
            log.info("model %s: idle for %.0f s, unloading (loads on demand)", served.key, idle)
            await stop_engine(served)
        return done

    async def stop(self) -> None:
        """Stop checking."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
