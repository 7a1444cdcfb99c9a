"""A model's worker under another interpreter (``[[models]] worker.python``): the version
check's one-line errors, and a real worker started through that path (the ``null``
backend under this environment's own interpreter given explicitly: the subprocess path,
not multiprocessing) that serves, dies by SIGKILL, and comes back."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from pathlib import Path

import pytest

from servehall.config.models import ModelConfig
from servehall.config.worker import WorkerSettings
from servehall.engines.contract import SamplingParams
from servehall.errors import ConfigError
from servehall.worker import ProcessEngine
from servehall.worker.bootstrap import WorkerSpec
from servehall.worker.foreign import check_interpreter, spec_from_json, spec_to_json
from servehall.worker.messages import WIRE_VERSION


def _model(tmp: Path, python: Path | None) -> ModelConfig:
    d = tmp / "null-model"
    d.mkdir(exist_ok=True)
    cfg = {"vocab_size": 100, "max_position_embeddings": 512, "eos_token_id": 2}
    (d / "config.json").write_text(json.dumps(cfg))
    return ModelConfig(
        name="n",
        path=d,
        backend="null",
        worker=WorkerSettings(python=python, restart_backoff_s=0.1),
    )


async def test_wrong_path_is_one_clear_line(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere" / "python"
    engine = ProcessEngine(_model(tmp_path, missing), "null", ())
    with pytest.raises(ConfigError) as info:
        await engine.start()
    msg = str(info.value)
    assert msg == f"model n: models.n.worker.python: {missing} is not an executable file" or (
        msg == f"models.n.worker.python: {missing} is not an executable file"
    )
    assert "\n" not in msg


async def test_interpreter_without_servehall(tmp_path: Path) -> None:
    # the system's own python: a real interpreter that has no servehall
    bare = tmp_path / "bare-python"
    bare.write_text(f'#!/bin/sh\nexec env -u PYTHONPATH {sys.base_prefix}/bin/python3 -I "$@"\n')
    bare.chmod(0o755)
    with pytest.raises(ConfigError, match=r"cannot run the servehall worker \(.*No module named"):
        await check_interpreter(bare, "n")


async def test_version_mismatch_names_both(tmp_path: Path) -> None:
    # an environment holding another servehall version: a package of that name first on
    # the path, reporting version 0.0.1 and wire protocol WIRE_VERSION + 1
    other = tmp_path / "other-env" / "servehall" / "worker"
    other.mkdir(parents=True)
    (other.parent / "__init__.py").write_text("")
    (other / "__init__.py").write_text("")
    (other / "foreign.py").write_text(
        f"import json\nprint(json.dumps({{'servehall': '0.0.1', 'wire': {WIRE_VERSION + 1}}}))\n"
    )
    wrapper = tmp_path / "python"
    wrapper.write_text(f'#!/bin/sh\nPYTHONPATH={other.parent.parent} exec {sys.executable} "$@"\n')
    wrapper.chmod(0o755)
    with pytest.raises(ConfigError) as info:
        await check_interpreter(wrapper, "n")
    msg = str(info.value)
    assert msg.startswith("models.n.worker.python: ") and "\n" not in msg
    assert f"servehall 0.0.1 (wire protocol {WIRE_VERSION + 1})" in msg
    assert f"wire protocol {WIRE_VERSION})" in msg


def test_spec_round_trips_as_json(tmp_path: Path) -> None:
    spec = WorkerSpec(
        model=_model(tmp_path, Path(sys.executable)),
        backend="null",
        plugins=("auth",),
        socket_path="/tmp/w-2.sock",
        parent_pid=1,
        generation=2,
        heartbeat_interval_s=0.1,
        strict_plugins=False,
    )
    assert spec_from_json(spec_to_json(spec)) == spec


async def test_worker_under_given_interpreter_serves_dies_and_restarts(tmp_path: Path) -> None:
    info = await check_interpreter(Path(sys.executable), "n")
    assert info["wire"] == WIRE_VERSION
    engine = ProcessEngine(_model(tmp_path, Path(sys.executable)), "null", ("not-installed",))
    await engine.start()
    try:
        pid = engine.worker_pid
        assert pid is not None
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        assert b"servehall.worker.foreign" in cmdline  # not a multiprocessing child
        params = SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True)
        out = [d async for d in engine.add_request("a", [5, 6, 7], params)]
        assert out[-1].finish_reason == "length"
        os.kill(pid, signal.SIGKILL)
        for _ in range(300):
            if engine.worker_up and engine.worker_pid != pid:
                break
            await asyncio.sleep(0.1)
        assert engine.worker_up and engine.worker_pid != pid
        assert engine.restart_counts["crashed"] == 1
        out = [d async for d in engine.add_request("b", [5, 6, 7], params)]
        assert out[-1].finish_reason == "length"
    finally:
        await engine.shutdown()
