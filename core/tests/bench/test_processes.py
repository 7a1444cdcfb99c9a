"""Tests of servehall.bench.processes: the ``--api-processes`` list, h2load's connection
shape, CPU time by process role on a real process tree (a parent with a child whose
command line names the frontend module, and one that does not), the per-process split
of two reads, and the summary of a py-spy raw profile. No timing assertions."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from servehall.bench.client import TargetError
from servehall.bench.processes import (
    FRONTEND_MODULE,
    api_cpu_s,
    connections_by_role,
    cpu_by_role,
    frame_library,
    frontend_cpu_s,
    h2load_args,
    h2load_shape,
    parse_api_processes,
    process_role,
    process_roles_cpu_s,
    self_by_library,
    top_frames,
)

pytest.importorskip("psutil")  # the bench extra


def test_api_processes_list_keeps_order_and_drops_repeats() -> None:
    assert parse_api_processes("1,2") == [1, 2]
    assert parse_api_processes(" 8, 1 ,4,1") == [8, 1, 4]
    assert parse_api_processes("64") == [64]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("0", r"^API processes must be in 1\.\.64 \(got 0\)$"),
        ("1,65", r"^API processes must be in 1\.\.64 \(got 65\)$"),
        ("1,two", r"^'two' is not a number of API processes$"),
        ("", r"^'' is not a number of API processes$"),
        ("1,,2", r"^'' is not a number of API processes$"),
    ],
)
def test_bad_api_processes_lists_are_named(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_api_processes(text)


def test_h2load_shape() -> None:
    # default: one connection per 64 streams (the single-process method)
    assert h2load_shape(64, None) == (1, 64)
    assert h2load_shape(256, None) == (4, 64)
    assert h2load_shape(65, None) == (2, 32)
    # several connections, so that the kernel can spread them over frontends
    assert h2load_shape(256, 8) == (8, 32)
    assert h2load_shape(64, 8) == (8, 8)
    assert h2load_shape(4, 8) == (4, 1)  # never more connections than streams
    with pytest.raises(ValueError, match=r"^connections must be at least 1 \(got 0\)$"):
        h2load_shape(64, 0)
    with pytest.raises(ValueError, match=r"^concurrency must be at least 1 \(got 0\)$"):
        h2load_shape(0, 8)


def test_process_role_from_the_command_line() -> None:
    assert process_role([sys.executable, "-m", FRONTEND_MODULE, "{}"]) == "frontend"
    assert process_role([sys.executable, "-m", "servehall.engines.child"]) == "worker"
    assert process_role([]) == "worker"


_TREE = f"""
import subprocess, sys, time
spin = ("import time\\nend = time.process_time() + 0.3\\n"
        "while time.process_time() < end: pass\\ntime.sleep(60)")
kids = [
    subprocess.Popen([sys.executable, "-c", spin, "-m", "{FRONTEND_MODULE}"]),
    subprocess.Popen([sys.executable, "-c", spin, "-m", "{FRONTEND_MODULE}"]),
    subprocess.Popen([sys.executable, "-c", spin]),
]
print("up", flush=True)
time.sleep(60)
"""


def test_cpu_by_role_on_a_real_process_tree() -> None:
    proc = subprocess.Popen([sys.executable, "-c", _TREE], stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == b"up"
        before = {proc.pid: ("primary", 0.0)}  # as if read at the parent's start
        deadline = time.monotonic() + 20
        while True:  # until all three children have spun their 0.3 s
            after = process_roles_cpu_s(proc.pid)
            kids = [cpu for p, (_, cpu) in after.items() if p != proc.pid]
            if len(kids) == 3 and min(kids) >= 0.29:
                break
            assert time.monotonic() < deadline, after
            time.sleep(0.1)
        roles = sorted(role for role, _ in after.values())
        assert roles == ["frontend", "frontend", "primary", "worker"]
        split = cpu_by_role(before, after)
        assert list(split) == ["primary", "frontend 1", "frontend 2", "worker"]
        # children started after the first read count from zero
        assert split["frontend 1"] >= 0.29 and split["frontend 2"] >= 0.29
        assert split["worker"] >= 0.29
        assert frontend_cpu_s(split) == split["frontend 1"] + split["frontend 2"]
        assert api_cpu_s(split) == split["primary"] + frontend_cpu_s(split)
    finally:
        proc.kill()
        proc.wait()


def test_cpu_by_role_differences_and_exits() -> None:
    before = {1: ("primary", 1.0), 30: ("frontend", 2.0), 20: ("frontend", 5.0), 7: ("worker", 1.0)}
    # frontend 30 died and came back as 40; worker 7 exited, worker 8 started
    after = {
        1: ("primary", 1.5),
        20: ("frontend", 5.25),
        40: ("frontend", 0.5),
        8: ("worker", 0.125),
    }
    split = cpu_by_role(before, after)
    assert split == {"primary": 0.5, "frontend 1": 0.25, "frontend 2": 0.5, "worker": 0.125}
    assert cpu_by_role({1: ("primary", 1.0)}, {1: ("primary", 3.0)}) == {
        "primary": 2.0,
        "worker": 0.0,
    }


def test_a_missing_process_is_a_target_error() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    with pytest.raises(TargetError, match=rf"^cannot read the CPU time of process {proc.pid}"):
        process_roles_cpu_s(proc.pid)


def test_top_frames_of_a_raw_profile() -> None:
    raw = "\n".join(
        [
            "main (a.py:1);loop (b.py:2);send (h2.py:3) 6",
            "main (a.py:1);loop (b.py:2);parse (c.py:4) 3",
            "main (a.py:1);send (h2.py:3) 1",
            "main (a.py:1);f (d.py:1);f (d.py:1) 2",  # recursion: counted once in total
            "garbage line",
            "",
        ]
    )
    samples, own, total = top_frames(raw, k=2)
    assert samples == 12
    assert own == [("send (h2.py:3)", 7), ("parse (c.py:4)", 3)]
    assert total == [("main (a.py:1)", 12), ("loop (b.py:2)", 9)]
    assert top_frames("", 5) == (0, [], [])


def test_connections_by_role_counts_accepted_connections() -> None:
    import os
    import socket

    with socket.create_server(("127.0.0.1", 0)) as srv:
        port = srv.getsockname()[1]
        clients = [socket.create_connection(("127.0.0.1", port)) for _ in range(3)]
        accepted = [srv.accept()[0] for _ in clients]
        try:
            counts = connections_by_role(os.getpid(), port)
            # this process holds both ends; only the accepted ends have laddr.port == port
            assert counts["primary"] == 3 and counts["worker"] == 0
        finally:
            for s in clients + accepted:
                s.close()


def test_self_samples_by_library() -> None:
    assert frame_library("send (h2/connection.py:3)") == "h2"
    assert frame_library("emit (servehall/api/sse.py:130)") == "servehall/api"
    assert frame_library("main (servehall/cli.py:1)") == "servehall"
    assert frame_library("__init__ (<string>:6)") == "<string>"
    assert frame_library("weird") == "?"
    raw = "\n".join(
        [
            "main (a.py:1);loop (asyncio/base_events.py:2);send (h2/connection.py:3) 6",
            "main (a.py:1);emit (servehall/api/sse.py:130) 3",
            "main (a.py:1);other (h2/frame_buffer.py:165) 2",
            "bad",
        ]
    )
    assert self_by_library(raw) == [("h2", 8), ("servehall/api", 3)]


def test_h2load_args() -> None:
    assert h2load_args(64, None) == ["-c", "1", "-m", "64"]
    assert h2load_args(256, 8, 20) == ["-c", "8", "-m", "32", "-r", "1", "--rate-period", "20ms"]
    assert h2load_args(64, 8, 2.5)[-1] == "2.5ms"
    with pytest.raises(ValueError, match=r"^stagger must not be negative \(got -1\)$"):
        h2load_args(64, 8, -1)
