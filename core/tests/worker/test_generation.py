"""One worker generation (:mod:`servehall.worker.generation`): a real worker process of
the ``null`` backend spawned, heard, told to stop and torn down; output lines kept."""

from __future__ import annotations

import asyncio
import collections
import json
import multiprocessing
import os
from pathlib import Path
from typing import Any

import pytest

from servehall.config.models import ModelConfig
from servehall.engines.contract import SamplingParams
from servehall.worker.bootstrap import WorkerSpec
from servehall.worker.generation import Generation, kill_group
from servehall.worker.messages import AddRequest, Heartbeat, StepOutput, StopWorker, WorkerReady


def _model(tmp: Path) -> ModelConfig:
    d = tmp / "null-model"
    d.mkdir(exist_ok=True)
    cfg = {"vocab_size": 100, "max_position_embeddings": 512, "eos_token_id": 2}
    (d / "config.json").write_text(json.dumps(cfg))
    return ModelConfig(name="n", path=d, backend="null")


def test_kill_group_leaves_no_group_and_its_own_alone() -> None:
    for pgid in (None, 0, 1, os.getpgrp()):
        kill_group(pgid)  # nothing to do, no error
    kill_group(2**22 + 12345)  # a group with no process left is no error


def test_a_generation_without_a_process_sends_and_reads_nothing() -> None:
    gen = Generation(1, name="n", stderr=collections.deque(), on_report=lambda g, m: None)
    gen.send([StopWorker()])  # not connected: dropped
    assert not gen.reports_pending()
    gen.read_output()
    gen.close_output()


def test_output_lines_are_kept_and_forwarded(capsys: pytest.CaptureFixture[str]) -> None:
    tail: collections.deque[str] = collections.deque(maxlen=2)
    gen = Generation(1, name="n", stderr=tail, on_report=lambda g, m: None)
    r, w = os.pipe()
    os.set_blocking(r, False)
    gen.output_fd = r
    os.write(w, b"one\ntwo\nthree\npart")
    gen.read_output()
    assert list(tail) == ["two", "three"] and gen.partial == b"part"
    os.close(w)
    gen.read_output()  # the end: the partial line is kept, the pipe closed
    assert list(tail) == ["three", "part"] and gen.output_fd is None
    assert capsys.readouterr().err == "one\ntwo\nthree\n"


async def test_a_null_worker_is_spawned_heard_stopped_and_torn_down(tmp_path: Path) -> None:
    loop = asyncio.get_running_loop()
    reports: list[Any] = []
    exited: list[Generation] = []

    def on_exit(gen: Generation) -> None:  # as the supervisor: stop watching the sentinel
        loop.remove_reader(gen.proc.sentinel)
        exited.append(gen)

    tail: collections.deque[str] = collections.deque(maxlen=40)

    def on_report(gen: Generation, msg: Any) -> None:
        reports.append(msg)
        if isinstance(msg, Heartbeat) and gen.ready is not None and not gen.ready.done():
            gen.ready.set_result(None)

    gen = Generation(1, name="n", stderr=tail, on_report=on_report)
    spec = WorkerSpec(
        model=_model(tmp_path),
        backend="null",
        plugins=(),
        socket_path=str(tmp_path / "w-1.sock"),
        parent_pid=os.getpid(),
        generation=1,
        heartbeat_interval_s=0.1,
    )
    gen.spawn(
        loop,
        spec,
        mp=multiprocessing.get_context("spawn"),
        python=None,
        spec_path=tmp_path / "spec-1.json",
        on_exit=on_exit,
    )
    try:
        assert gen.ready is not None
        await asyncio.wait_for(gen.ready, 120)
        assert isinstance(reports[0], WorkerReady) and reports[0].pid == gen.proc.pid
        params = SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True)
        gen.send([AddRequest("r", [3, 4], params)])
        for _ in range(600):
            steps = [m for m in reports if isinstance(m, StepOutput)]
            if any(d[2] is not None for m in steps for d in m.deltas):
                break
            await asyncio.sleep(0.05)
        tokens = [t for m in steps for d in m.deltas if d[0] == "r" for t in d[1]]
        assert len(tokens) == 2
        gen.send([StopWorker()])
        await gen.wait_exit(30)
        assert gen.proc.exitcode == 0
        for _ in range(100):
            if exited:
                break
            await asyncio.sleep(0.02)
        assert exited == [gen]
    finally:
        await gen.teardown(kill=True)
    assert gen.commands is None and gen.reports is None and gen.output_fd is None
    assert gen.reader is not None and gen.reader.done()
