"""A starved worker is not restarted; a frozen one is (issue 33, item 8), end to end: a
real ``servehall serve`` with the demo model in a worker process.

* **Starved:** CPU hogs saturate every core for 10 s while the worker runs at the idle
  scheduling class (``SCHED_IDLE``, every thread): it gets almost no CPU, so its
  heartbeats are late by far more than ``heartbeat_timeout_s``. ``/proc`` shows it
  runnable (busy), so it is not restarted (``servehall_engine_busy_silences_total``
  counts the forgiven silences), a request sent meanwhile is answered, and no restart
  is counted.
* **Frozen:** SIGSTOP of the worker: it is declared lost (reason ``stopped``) within the
  documented bound, ``heartbeat_timeout_s`` + 0.1 s (docs/workers.md), plus slack for a
  loaded machine, and a new worker serves.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import demo_config
from tests.test_worker_e2e import metric, wait_until, worker_pids

pytestmark = pytest.mark.skipif(
    not hasattr(os, "SCHED_IDLE") or not Path("/proc/self/task").is_dir(),
    reason="needs Linux (/proc, SCHED_IDLE)",
)

HEARTBEAT_TIMEOUT_S = 1.0  # the product's default
STARVE_S = 10.0
WATCH_S = 0.1  # servehall.worker.supervisor.WATCH_INTERVAL_S
SLACK_S = 2.0  # a loaded 2-core machine (other tests, other sessions)


@contextlib.contextmanager
def hogs(seconds: float) -> Iterator[list[subprocess.Popen[bytes]]]:
    """Two busy-looping processes per usable CPU, each pinned to its CPU, for
    ``seconds`` (they exit by themselves; killed on the way out in any case)."""
    code = f"import time\nend = time.monotonic() + {seconds}\nwhile time.monotonic() < end: pass"
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for cpu in sorted(os.sched_getaffinity(0)):
            for _ in range(2):
                p = subprocess.Popen([sys.executable, "-c", code])
                procs.append(p)
                with contextlib.suppress(OSError):
                    os.sched_setaffinity(p.pid, {cpu})
        yield procs
    finally:
        for p in procs:
            p.kill()
            p.wait(10)


def idle_class(pid: int) -> int:
    """Put every thread of ``pid`` in the SCHED_IDLE class; the number of threads."""
    n = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(ProcessLookupError):
            os.sched_setscheduler(int(tid), os.SCHED_IDLE, os.sched_param(0))
            n += 1
    return n


@pytest.fixture
def server(servehall_server: Callable[..., Any], demo_model_dir: Path) -> Any:
    cfg = demo_config(demo_model_dir)
    cfg["models"][0]["worker"] = {
        "heartbeat_timeout_s": HEARTBEAT_TIMEOUT_S,
        "restart_backoff_s": 0.2,
    }
    with servehall_server(cfg, name="worker-starved") as srv:
        yield srv


@pytest.mark.serial
def test_a_starved_worker_is_kept_and_a_stopped_one_is_replaced(server: Any) -> None:
    (worker,) = worker_pids(server.process.pid)
    assert idle_class(worker) >= 2  # the main thread and the heartbeat thread at least
    answers: list[httpx.Response] = []

    def request() -> None:
        with httpx.Client(base_url=server.base_url, timeout=120) as c:
            answers.append(
                c.post(
                    "/v1/completions",
                    json={"model": "demo", "prompt": "hello", "max_tokens": 8, "temperature": 0},
                )
            )

    with httpx.Client(base_url=server.base_url, timeout=60) as c:
        with hogs(STARVE_S):
            time.sleep(1.0)  # the hogs have the CPUs
            t = threading.Thread(target=request)
            t.start()
            time.sleep(STARVE_S - 1.0)
        t.join(120)
        assert answers and answers[0].status_code == 200, answers and answers[0].text
        text = c.get("/metrics").text
        busy = metric(text, "servehall_engine_busy_silences_total", model="demo")
        print(f"silences forgiven as busy while starved: {busy}")
        for reason in ("heartbeat_timeout", "stopped", "crashed", "step_stalled"):
            assert (
                metric(text, "servehall_engine_restarts_total", model="demo", reason=reason) == 0
            ), reason
        assert worker_pids(server.process.pid) == [worker]
        # the starvation was real: the worker was silent for longer than the timeout
        assert busy is not None and busy >= 1, "the worker never missed a heartbeat"
        assert "but busy" in server.log_text()

        os.kill(worker, signal.SIGSTOP)
        stopped = time.monotonic()
        try:

            def lost() -> bool:
                text = c.get("/metrics").text
                n = metric(text, "servehall_engine_restarts_total", model="demo", reason="stopped")
                return bool(n)

            took = wait_until(lost, 30, 0.02)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(worker, signal.SIGCONT)
        print(f"the stopped worker was declared lost after {took:.2f} s")
        assert took <= HEARTBEAT_TIMEOUT_S + WATCH_S + SLACK_S, took
        assert time.monotonic() - stopped >= HEARTBEAT_TIMEOUT_S
        wait_until(lambda: c.get("/health/ready").status_code == 200, 120, 0.2)
        r = c.post(
            "/v1/completions",
            json={"model": "demo", "prompt": "hi", "max_tokens": 3, "temperature": 0},
        )
        assert r.status_code == 200, r.text
        assert worker_pids(server.process.pid) != [worker]
