"""Connection churn: open and close N connections, then count the server's descriptors.

Usage: ``python bench/bench_connections.py [--connections N] [--concurrency C]
[--no-servehall] [--no-bare]``

Each connection makes one ``GET /health/live`` (even connections over HTTP/1.1, odd ones
over cleartext HTTP/2 with prior knowledge) and is then closed by the client. Three
servers get the same churn, one after the other, each in its own process:

* ``bare Hypercorn`` — Hypercorn 0.18 serving a one-route ASGI app, no servehall code:
  the baseline, showing what servehall corrects (closed connections held in
  ``CLOSE-WAIT`` for ``keep_alive_timeout``, 75 s here as servehall's default);
* ``Hypercorn + fixes`` — the same app with
  :func:`servehall.server.hypercorn.install_connection_fixes`;
* ``servehall serve --demo`` — the real server (demo model; skipped with
  ``--no-servehall``).

For each it prints the descriptors the server process had open before the churn
(baseline), at the peak, right after the last close and once settled (at most 5 s
later), the sockets in ``CLOSE-WAIT`` 1 s after the last close, the time from the last
close until the descriptor count is back within 2 of the baseline, and connections per
second. Linux only (``/proc``). Not part of the test suite; figures depend on the
machine — say how loaded it was when you quote them.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from servehall.testing.rawhttp import H2Client, read_response
from servehall.testing.sockets import free_port, open_fds, server_socket_states

KEEP_ALIVE_S = 75.0

_APP = """
import asyncio, socket, sys
from hypercorn.asyncio import serve
from hypercorn.config import Config

async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"text/plain"), (b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})

if sys.argv[2] == "fixes":
    from servehall.server.hypercorn import install_connection_fixes
    install_connection_fixes()
sock = socket.socket()
sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
sock.bind(("127.0.0.1", int(sys.argv[1])))
sock.listen(1024)
sock.set_inheritable(True)
cfg = Config()
cfg.bind = [f"fd://{sock.detach()}"]
cfg.keep_alive_timeout = float(sys.argv[3])
cfg.accesslog = None
cfg.errorlog = None
print("ready", flush=True)
asyncio.run(serve(app, cfg))
"""


def _wait_http(port: int, proc: subprocess.Popen[Any], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError("the server exited")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
                s.sendall(b"GET /health/ready HTTP/1.1\r\nHost: x\r\n\r\n")
                if read_response(s, bytearray())[0] == 200:
                    return
        except OSError:
            pass
        time.sleep(0.3)
    raise RuntimeError("the server did not get ready")


def start_hypercorn(mode: str) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-c", _APP, str(port), mode, str(KEEP_ALIVE_S)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == b"ready"
    _wait_http(port, proc, 30)
    return proc, port


def start_servehall(workdir: Path) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    exe = shutil.which("servehall") or str(Path(sys.executable).with_name("servehall"))
    proc = subprocess.Popen(
        [exe, "serve", "--demo", "--bind", f"127.0.0.1:{port}"],
        cwd=workdir,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={k: v for k, v in os.environ.items() if k != "SERVEHALL_CONFIG"},
    )
    _wait_http(port, proc, 600)
    return proc, port


def one_connection(port: int, h2: bool) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        if h2:
            client = H2Client(s)
            sid = client.request("GET", "/health/live")
            if not client.wait([sid]) or client.streams[sid].status != 200:
                raise RuntimeError("h2 request failed")
        else:
            s.sendall(b"GET /health/live HTTP/1.1\r\nHost: x\r\n\r\n")
            if read_response(s, bytearray())[0] != 200:
                raise RuntimeError("h1 request failed")


def churn(pid: int, port: int, n: int, concurrency: int) -> dict[str, float]:
    """Open/close ``n`` connections from ``concurrency`` threads; descriptor figures."""
    time.sleep(0.5)
    baseline = open_fds(pid)
    peak = baseline
    counter = iter(range(n))
    lock = threading.Lock()
    errors: list[BaseException] = []
    done = threading.Event()

    def worker() -> None:
        while True:
            with lock:
                i = next(counter, None)
            if i is None:
                return
            try:
                one_connection(port, h2=bool(i % 2))
            except BaseException as exc:
                errors.append(exc)

    def sampler() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, open_fds(pid))
            time.sleep(0.05)

    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    watch = threading.Thread(target=sampler)
    t0 = time.monotonic()
    watch.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    closed_at = time.monotonic()
    done.set()
    watch.join()
    after = open_fds(pid)
    peak = max(peak, after)
    back_s = float("nan")
    settled = after
    while time.monotonic() - closed_at < 5.0:
        settled = open_fds(pid)
        if settled <= baseline + 2:
            back_s = time.monotonic() - closed_at
            break
        time.sleep(0.01)
    time.sleep(max(0.0, closed_at + 1.0 - time.monotonic()))
    close_wait_1s = server_socket_states(port)["CLOSE-WAIT"]
    if errors:
        print(f"  {len(errors)} connection(s) failed, first: {errors[0]!r}")
    return {
        "baseline": baseline,
        "peak": peak,
        "after": after,
        "settled": settled,
        "close_wait_1s": close_wait_1s,
        "back_s": back_s,
        "rate": n / (closed_at - t0),
        "errors": len(errors),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--connections", type=int, default=5000)
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--no-servehall", action="store_true", help="skip servehall serve --demo")
    p.add_argument("--no-bare", action="store_true", help="skip the bare Hypercorn baseline")
    args = p.parse_args()

    runs: list[tuple[str, Any]] = []
    if not args.no_bare:
        runs.append(("bare Hypercorn", lambda: start_hypercorn("bare")))
    runs.append(("Hypercorn + fixes", lambda: start_hypercorn("fixes")))
    tmp = tempfile.TemporaryDirectory()
    if not args.no_servehall:
        runs.append(("servehall serve --demo", lambda: start_servehall(Path(tmp.name))))

    print(
        f"{args.connections} connections (half HTTP/1.1, half h2c), one GET /health/live "
        f"each, {args.concurrency} client threads, keep_alive_timeout {KEEP_ALIVE_S:g} s"
    )
    header = (
        f"{'server':<24} {'fds before':>10} {'peak':>6} {'at close':>8} {'settled':>8} "
        f"{'CLOSE-WAIT@1s':>13} {'back in s':>9} {'conn/s':>7}"
    )
    print(header)
    print("-" * len(header))
    try:
        for name, start in runs:
            proc, port = start()
            try:
                r = churn(proc.pid, port, args.connections, args.concurrency)
            finally:
                proc.terminate()
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    proc.kill()
            back = "never" if r["back_s"] != r["back_s"] else f"{r['back_s']:.2f}"
            print(
                f"{name:<24} {r['baseline']:>10.0f} {r['peak']:>6.0f} {r['after']:>8.0f} "
                f"{r['settled']:>8.0f} {r['close_wait_1s']:>13.0f} {back:>9} {r['rate']:>7.0f}"
            )
    finally:
        tmp.cleanup()
    print("('back in s': from the last close until the count is within 2 of the baseline;")
    print(" 'never' means not within 5 s)")


if __name__ == "__main__":
    main()
