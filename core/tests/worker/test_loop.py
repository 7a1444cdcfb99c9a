"""The worker's serve/step loop (:mod:`servehall.worker.loop`): how step output leaves."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pydantic
import pytest

from servehall.config.models import ModelConfig
from servehall.config.worker import WorkerSettings
from servehall.engines.contract import TokenDelta
from servehall.worker.bootstrap import WorkerSpec
from servehall.worker.loop import WorkerLoop


def test_step_output_waits_for_the_stream_interval_but_firsts_and_ends_do_not(
    tmp_path: Path,
) -> None:
    """The worker's step sink (engine step thread) sends a step's tokens at once when they
    start or end a request, else at most once per ``stream_interval_s``: held tokens are
    merged per request into the next message."""
    assert WorkerSettings().stream_interval_s == 0.02
    with pytest.raises(pydantic.ValidationError):
        WorkerSettings(stream_interval_s=-0.1)
    spec = WorkerSpec(
        model=ModelConfig(name="m", path=tmp_path),
        backend="null",
        plugins=(),
        socket_path=str(tmp_path / "w.sock"),
        parent_pid=os.getpid(),
        generation=1,
        heartbeat_interval_s=0.1,
        stream_interval_s=0.01,
    )
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(spec.socket_path)
    listener.listen(2)  # the worker connects at once (commands, reports)
    worker = WorkerLoop(spec)
    sent: list[list[tuple[object, ...]]] = []
    now = [100.0]
    worker.clock = lambda: now[0]
    worker._ship = sent.append  # type: ignore[method-assign,assignment]
    try:
        worker.on_step([("a", TokenDelta((1,)))])  # a's first tokens: at once
        now[0] += 0.002
        worker.on_step([("a", TokenDelta((2,)))])  # held
        now[0] += 0.002
        worker.on_step([("a", TokenDelta((3,)))])  # held
        assert sent == [[("a", (1,), None, None, None)]]
        now[0] += 0.007  # 11 ms since the last message
        worker.on_step([("a", TokenDelta((4,)))])
        assert sent[1] == [("a", (2, 3, 4), None, None, None)]
        now[0] += 0.001
        worker.on_step([("a", TokenDelta((5,))), ("b", TokenDelta((7,)))])  # b is new
        assert sent[2] == [("a", (5,), None, None, None), ("b", (7,), None, None, None)]
        now[0] += 0.001
        worker.on_step([("a", TokenDelta((6,))), ("b", TokenDelta((8,)))])  # held
        now[0] += 0.001
        worker.on_step([("a", TokenDelta((9,), "stop"))])  # a ends: at once, with b's
        assert sent[3] == [("a", (6, 9), "stop", None, None), ("b", (8,), None, None, None)]
        assert len(sent) == 4
    finally:
        worker._close()
        listener.close()
