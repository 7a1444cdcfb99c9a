"""Tests of servehall.worker.supervisor with real worker processes of the ``null``
backend (no model, quick to start): the lifecycle states, a killed worker restarted with
backoff and an audit event, a crash loop that stops the restarts, and a start failure
that is not restarted. (Silence, stalls and the kernel's view are tested with the torch
worker in ``test_client.py`` and ``test_liveness.py``.)"""

from __future__ import annotations

import asyncio
import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest

from servehall.config.models import ModelConfig
from servehall.config.worker import WorkerSettings
from servehall.engines.contract import SamplingParams
from servehall.errors import ConfigError
from servehall.worker import ProcessEngine
from servehall.worker.supervisor import RESTART_REASONS


def _model(tmp: Path, **options: Any) -> ModelConfig:
    d = tmp / "null-model"
    d.mkdir(exist_ok=True)
    cfg = {"vocab_size": 100, "max_position_embeddings": 512, "eos_token_id": 2}
    (d / "config.json").write_text(json.dumps(cfg))
    return ModelConfig(name="n", path=d, backend="null", options=options)


async def _until(cond: Any, timeout: float = 30.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not cond():
        assert loop.time() < deadline, "condition not reached"
        await asyncio.sleep(0.02)


async def test_lifecycle_states(tmp_path: Path) -> None:
    engine = ProcessEngine(_model(tmp_path), "null", (), settings=WorkerSettings())
    sup = engine.supervisor
    assert (sup.state, sup.state_reason, sup.worker_pid) == ("new", "engine not started", None)
    assert await sup.wait_up(0.01) is False  # not started: no wait
    assert set(sup.restart_counts) == set(RESTART_REASONS)
    await engine.start()
    try:
        assert sup.state == "up" and sup.worker_up and sup.state_reason == ""
        assert sup.worker_pid is not None and sup.started_at > 0
        assert await sup.wait_up(0.01) is True
        await _until(lambda: sup.heartbeat is not None)
        stream = engine.add_request("r", [5, 6, 7], SamplingParams(3, temperature=0))
        deltas = [d async for d in stream]
        assert deltas[-1].finish_reason == "length"
    finally:
        await engine.shutdown()
    assert sup.state == "stopped" and not sup.worker_up
    assert sup.worker_pid is None  # none runs any more
    assert sum(sup.restart_counts.values()) == 0


async def test_a_killed_worker_is_restarted_with_an_event(tmp_path: Path) -> None:
    events: list[tuple[str, dict[str, Any]]] = []
    settings = WorkerSettings(restart_backoff_s=0.05, crash_loop_restarts=5)
    engine = ProcessEngine(
        _model(tmp_path), "null", (), settings=settings, on_event=lambda a, d: events.append((a, d))
    )
    await engine.start()
    sup = engine.supervisor
    try:
        first = sup.worker_pid
        assert first is not None
        os.kill(first, signal.SIGKILL)
        await _until(lambda: sup.state != "up")
        assert "SIGKILL" in sup.state_reason
        await _until(lambda: sup.state == "up")
        assert sup.worker_pid not in (None, first)
        assert sup.restart_counts["crashed"] == 1 and sup.last_exit_reason == "crashed"
        [(action, details)] = events
        assert action == "restart" and details["model"] == "n" and details["kind"] == "crashed"
        assert details["delay_s"] == 0.05 and details["generation"] == 2
        # the new worker serves
        deltas = [d async for d in engine.add_request("r", [5, 6], SamplingParams(2))]
        assert deltas[-1].finish_reason == "length"
    finally:
        await engine.shutdown()


async def test_a_crash_loop_stops_restarting(tmp_path: Path) -> None:
    events: list[str] = []
    settings = WorkerSettings(restart_backoff_s=0.05, crash_loop_restarts=1)
    engine = ProcessEngine(
        _model(tmp_path), "null", (), settings=settings, on_event=lambda a, d: events.append(a)
    )
    await engine.start()
    sup = engine.supervisor
    try:
        pid = sup.worker_pid
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        await _until(lambda: sup.state == "up" and sup.worker_pid != pid)
        os.kill(sup.worker_pid, signal.SIGKILL)  # type: ignore[arg-type]
        await _until(lambda: sup.crash_looping)
        assert sup.state == "failed" and sup.state_reason.startswith(
            "crash loop: 2 worker failure(s) within 300 s, not restarting; last: "
        )
        assert events == ["restart", "crash_loop"]
        assert await sup.wait_up(5) is False  # answers at once
        health = await engine.health()
        assert not health.ok and "crash loop" in health.reason
        await asyncio.sleep(0.3)
        assert sup.state == "failed" and sup.restart_counts["crashed"] == 1
    finally:
        await engine.shutdown()


async def test_a_start_failure_is_not_restarted(tmp_path: Path) -> None:
    events: list[str] = []
    engine = ProcessEngine(
        _model(tmp_path, tokens_per_s=0),  # refused by the null engine's options
        "null",
        (),
        settings=WorkerSettings(restart_backoff_s=0.05),
        on_event=lambda a, d: events.append(a),
    )
    with pytest.raises(ConfigError, match=r"model n: .*tokens_per_s"):
        await engine.start()
    sup = engine.supervisor
    assert sup.state == "stopped" and sup.worker_pid is None
    assert sum(sup.restart_counts.values()) == 0 and events == []
    await engine.shutdown()
