"""Fault injection (servehall.bench.soak.inject): the targets taken from the options, and
no injection at all without faults or without a server the soak started."""

from __future__ import annotations

import asyncio
import io
from pathlib import Path

from servehall.bench.soak.clients import Traffic
from servehall.bench.soak.inject import fault_targets, inject_faults
from servehall.bench.soak.options import SoakOptions


def test_the_targets_come_from_the_options(tmp_path: Path) -> None:
    opts = SoakOptions(
        faults=("worker-kill",), db_pid=4242, db_restart_cmd="a", redis_restart_cmd="b"
    )
    out = io.StringIO()
    targets = asyncio.run(fault_targets(opts, tmp_path, out))
    assert (targets.db_pid, targets.db_restart_cmd, targets.redis_restart_cmd) == (
        4242,
        "a",
        "b",
    )
    assert targets.log == tmp_path / "faults.log"
    assert "postmaster 4242" in out.getvalue()


def test_nothing_is_injected_without_faults_or_a_started_server(tmp_path: Path) -> None:
    targets = asyncio.run(fault_targets(SoakOptions(), tmp_path, io.StringIO()))
    traffic = Traffic()
    for opts in (SoakOptions(), SoakOptions(faults=("worker-kill",))):
        asyncio.run(inject_faults(opts, None, targets, traffic, io.StringIO()))
    assert traffic.faults == [] and traffic.fault_errors == []
