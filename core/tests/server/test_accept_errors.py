"""AcceptErrorMonitor: out-of-resource accept() failures are counted and logged once per
interval, never as a traceback; everything else goes to the previous handler.

One test runs asyncio's real accept path: a listening socket on a loop whose process
has no descriptor left (a lowered ``RLIMIT_NOFILE``), in a subprocess.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import subprocess
import sys
import textwrap
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from servehall.server.accept_errors import AcceptErrorMonitor


class FakeClock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def _emfile() -> OSError:
    return OSError(errno.EMFILE, "Too many open files")


def _metric(registry: CollectorRegistry, reason: str) -> float:
    value = registry.get_sample_value("servehall_accept_errors_total", {"reason": reason})
    return float(value or 0.0)


def test_counts_every_failure_and_logs_once_per_interval(caplog: pytest.LogCaptureFixture) -> None:
    clock = FakeClock()
    registry = CollectorRegistry()
    mon = AcceptErrorMonitor(registry, interval_s=10.0, clock=clock)
    caplog.set_level(logging.WARNING, logger="servehall.server")
    for _ in range(300):  # CPython 3.11 retries accept() ~100 times per tick
        mon.record(_emfile())
    assert len(caplog.records) == 1
    assert "EMFILE" in caplog.records[0].getMessage()
    assert caplog.records[0].exc_info is None
    clock.t += 10.0
    mon.record(_emfile())
    assert len(caplog.records) == 2
    assert "300 accept() failures (EMFILE)" in caplog.records[1].getMessage()
    clock.t += 3.0
    mon.record(_emfile())
    mon.record(OSError(errno.ENFILE, "Too many open files in system"))
    assert len(caplog.records) == 2  # within the interval: counted, not logged
    mon.flush()  # what the timer does at the end of the interval
    assert "2 accept() failures" in caplog.records[2].getMessage()
    mon.flush()
    assert len(caplog.records) == 3  # nothing pending: nothing logged
    assert mon.total == {"EMFILE": 302, "ENFILE": 1}
    assert _metric(registry, "EMFILE") == 302
    assert _metric(registry, "ENFILE") == 1


async def test_loop_handler_passes_other_errors_on() -> None:
    loop = asyncio.get_running_loop()
    seen: list[dict[str, Any]] = []
    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda _loop, ctx: seen.append(ctx))
    mon = AcceptErrorMonitor(CollectorRegistry())
    mon.install(loop)
    try:
        loop.call_exception_handler({"message": "boom", "exception": ValueError("x")})
        loop.call_exception_handler({"message": "reset", "exception": ConnectionResetError()})
        loop.call_exception_handler(
            {"message": "socket.accept() out of system resource", "exception": _emfile()}
        )
        assert [c["message"] for c in seen] == ["boom", "reset"]
        assert mon.total == {"EMFILE": 1}
    finally:
        mon.uninstall()
        assert loop.get_exception_handler() is not mon
        loop.set_exception_handler(previous)


_REAL_ACCEPT = textwrap.dedent(
    """
    import asyncio, logging, os, resource, socket, sys
    from prometheus_client import CollectorRegistry
    from servehall.server.accept_errors import AcceptErrorMonitor

    logging.basicConfig(stream=sys.stdout, format="%(levelname)s %(name)s: %(message)s")

    async def main():
        registry = CollectorRegistry()
        mon = AcceptErrorMonitor(registry, interval_s=60.0)
        mon.install(asyncio.get_running_loop())
        server = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        # leave room for exactly the client sockets below, none for accept()
        clients = []
        n_open = len(os.listdir("/proc/self/fd"))
        hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        resource.setrlimit(resource.RLIMIT_NOFILE, (n_open + 3, hard))
        for _ in range(3):
            s = socket.socket()
            s.setblocking(False)
            try:
                s.connect(("127.0.0.1", port))
            except BlockingIOError:
                pass
            clients.append(s)
        await asyncio.sleep(2.5)  # asyncio retries accept() every second
        mon.uninstall()
        labels = {"reason": "EMFILE"}
        print("COUNT", registry.get_sample_value("servehall_accept_errors_total", labels))
        for s in clients:
            s.close()
        server.close()

    asyncio.run(main())
    """
)


def test_real_accept_out_of_descriptors_logs_no_traceback() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", _REAL_ACCEPT], capture_output=True, text=True, timeout=60
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    count = float(out.split("COUNT ", 1)[1].split()[0])
    assert count >= 2  # at least the first try and one retry a second later
    assert "Traceback" not in out
    lines = [ln for ln in out.splitlines() if "cannot accept connections" in ln]
    assert 1 <= len(lines) <= 2, out  # the first line, and the summary at uninstall
