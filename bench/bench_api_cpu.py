"""API-process CPU per streamed token and per one-token request (issue 38 item 2).

Usage: ``python bench/bench_api_cpu.py [--streams 256] [--stream-tokens 64]
[--stream-requests 2048] [--short-concurrency 64] [--short-requests 4096]
[--sink sql|none] [--isolation process|thread] [--no-bare] [--bare-plain]
[--no-servehall] [--json]``

Two servers get the same load, one after the other, each in its own process:

* ``servehall`` — ``servehall serve`` on the ``null`` backend (256 sequences, 5 ms
  steps: a ~51,200 tokens/s engine; only the demo model's tokenizer is read),
  ``isolation = "process"`` (default), ``[scheduler] max_concurrency = 256``, the
  default ``sql`` record sink (``--sink none``: no sink);
* ``bare`` — a Starlette + Hypercorn SSE app with no platform logic: it parses the JSON
  body and sends ``max_tokens`` OpenAI-shaped ``chat.completion.chunk`` events, one per
  5 ms (``asyncio.sleep``), then ``[DONE]`` — the baseline. Hypercorn gets servehall's
  settings (256 streams per connection, 75 s keep-alive, 1,000,000 requests per
  connection: Hypercorn's default of 1,000 ends h2load's one connection early) and its
  connection fixes (:func:`servehall.server.hypercorn.install_connection_fixes`, write
  coalescing included; ``--bare-plain``: without them).

The load generator is h2load (nghttp2, C, HTTP/2 cleartext with prior knowledge):
``--streams`` concurrent streams of ``--stream-tokens``-token chat completions
(``stream: true``), then ``--short-concurrency`` concurrent one-token streams. Each
workload gets a warm-up of its own (an eighth of the requests) that is not measured.
CPU time of the API process and of its children (the engine worker) comes from
``/proc/<pid>/stat`` (utime + stime, all threads) before and after each measured run.

Printed per workload: requests/s and tokens/s (h2load's own elapsed time; tokens =
succeeded requests × ``max_tokens``: the null engine always runs to ``max_tokens``),
API CPU per token (µs) or per request (ms), worker CPU, the API process's share of one
core, ``÷ bare`` (servehall's API CPU ÷ the bare app's), and ``SSE B/tok``: the response
body bytes per token (h2load's ``data`` traffic). servehall merges the deltas a stream
has not sent yet into one event (:meth:`servehall.engines.kit.DeltaStream.coalesce`), so
a process that falls behind sends fewer, larger events; with one event per token the
demo's chunks come to about 220 B per token. A lower figure means coalescing, and then
CPU per token is lower because there were fewer events to send, not cheaper ones —
compare per-token CPU at equal ``SSE B/tok``. Linux only. Not part of
the test suite; figures depend on the machine — quote the load average (printed).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _serve import Server, demo_dir, serving

from servehall.testing.sockets import free_port

TICKS = os.sysconf("SC_CLK_TCK")
STEP_MS = 5.0
MAX_NUM_SEQS = 256

_BARE_APP = r"""
import asyncio, json, socket, sys, time, uuid
from hypercorn.asyncio import serve
from hypercorn.config import Config
from starlette.applications import Starlette
from starlette.responses import StreamingResponse
from starlette.routing import Route

STEP_S = float(sys.argv[2])

async def chat(request):
    body = await request.json()
    n = int(body.get("max_tokens") or 16)
    model = body.get("model", "bare")
    rid = "chatcmpl-" + uuid.uuid4().hex
    created = int(time.time())

    async def events():
        for i in range(n):
            await asyncio.sleep(STEP_S)
            chunk = {"id": rid, "object": "chat.completion.chunk", "created": created,
                     "model": model, "choices": [{"index": 0, "delta": {"content": " tok"},
                     "logprobs": None, "finish_reason": "length" if i == n - 1 else None}]}
            yield "data: " + json.dumps(chunk) + "\n\n"
        yield "data: [DONE]\n\n"

    return StreamingResponse(events(), media_type="text/event-stream")

app = Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])
if sys.argv[3] == "fixes":
    from servehall.server.hypercorn import install_connection_fixes
    install_connection_fixes()
sock = socket.socket()
sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
sock.bind(("127.0.0.1", int(sys.argv[1])))
sock.listen(1024)
sock.set_inheritable(True)
cfg = Config()
cfg.bind = [f"fd://{sock.detach()}"]
cfg.h2_max_concurrent_streams = 256
cfg.keep_alive_timeout = 75.0
cfg.keep_alive_max_requests = 1_000_000
cfg.accesslog = None
cfg.errorlog = None
print("ready", flush=True)
asyncio.run(serve(app, cfg))
"""


@dataclass
class Row:
    """One measured workload on one server."""

    server: str
    workload: str
    requests: int
    succeeded: int
    seconds: float
    req_per_s: float
    tok_per_s: float
    api_cpu_s: float
    worker_cpu_s: float
    api_us_per_token: float
    api_ms_per_request: float
    worker_us_per_token: float
    api_core_share: float
    sse_bytes_per_token: float


def cpu_seconds(pid: int) -> float:
    """utime + stime of ``pid`` (all its threads), seconds, from ``/proc/<pid>/stat``."""
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def children(pid: int) -> list[int]:
    """Direct children of ``pid`` (from ``/proc/<pid>/task/*/children``)."""
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):
            out += [int(x) for x in (task / "children").read_text().split()]
    return out


def descendants(pid: int) -> list[int]:
    """All processes below ``pid``."""
    out: list[int] = []
    todo = children(pid)
    while todo:
        p = todo.pop()
        out.append(p)
        todo += children(p)
    return out


def tree_cpu(pids: list[int]) -> float:
    """Summed CPU seconds of ``pids`` that still exist."""
    total = 0.0
    for p in pids:
        with contextlib.suppress(OSError):
            total += cpu_seconds(p)
    return total


_FINISHED = re.compile(r"finished in ([\d.]+)(m?s), ([\d.]+) req/s")
_REQUESTS = re.compile(r"requests: (\d+) total, \d+ started, \d+ done, (\d+) succeeded")
_DATA = re.compile(r"traffic: .*?, [\d.]+\w*B \((\d+)\) data")


def h2load(url: str, body: Path, n: int, concurrency: int) -> tuple[int, int, float, int]:
    """Run h2load: ``n`` POSTs of ``body``, ``concurrency`` streams at once over at most
    64 streams per connection. Returns ``(requests, succeeded, elapsed_s, data_bytes)``
    (``data_bytes``: response body bytes received, h2load's ``data`` traffic)."""
    clients = max(1, -(-concurrency // 64))
    per = concurrency // clients
    cmd = [
        shutil.which("h2load") or "/usr/bin/h2load",
        "-n",
        str(n),
        "-c",
        str(clients),
        "-m",
        str(per),
        "-d",
        str(body),
        "-H",
        "content-type: application/json",
        url,
    ]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=900, check=False)
    fin = _FINISHED.search(res.stdout)
    req = _REQUESTS.search(res.stdout)
    if fin is None or req is None:
        raise RuntimeError(f"h2load output not understood:\n{res.stdout}\n{res.stderr}")
    elapsed = float(fin.group(1)) / (1000 if fin.group(2) == "ms" else 1)
    data = _DATA.search(res.stdout)
    return int(req.group(1)), int(req.group(2)), elapsed, int(data.group(1)) if data else 0


def measure(
    name: str,
    workload: str,
    url: str,
    api_pid: int,
    max_tokens: int,
    n: int,
    concurrency: int,
    model: str,
) -> Row:
    """Warm up, then one measured h2load run with CPU taken around it."""
    tmp = Path(tempfile.mkdtemp(prefix="bench-api-cpu-"))
    body = tmp / "body.json"
    body.write_text(
        json.dumps(
            {
                "model": model,
                "messages": [{"role": "user", "content": "Say something about the sea."}],
                "max_tokens": max_tokens,
                "stream": True,
            }
        )
    )
    h2load(url, body, max(concurrency, n // 8), concurrency)
    workers = descendants(api_pid)
    api0, w0 = cpu_seconds(api_pid), tree_cpu(workers)
    total, ok, elapsed, data = h2load(url, body, n, concurrency)
    api1, w1 = cpu_seconds(api_pid), tree_cpu(workers)
    if ok < total:
        print(f"  ! {name} {workload}: {total - ok} of {total} requests failed", file=sys.stderr)
    tokens = ok * max_tokens
    api, wk = api1 - api0, w1 - w0
    return Row(
        server=name,
        workload=workload,
        requests=total,
        succeeded=ok,
        seconds=round(elapsed, 3),
        req_per_s=round(ok / elapsed, 1),
        tok_per_s=round(tokens / elapsed, 1),
        api_cpu_s=round(api, 3),
        worker_cpu_s=round(wk, 3),
        api_us_per_token=round(api / max(tokens, 1) * 1e6, 2),
        api_ms_per_request=round(api / max(ok, 1) * 1e3, 3),
        worker_us_per_token=round(wk / max(tokens, 1) * 1e6, 2),
        api_core_share=round(api / elapsed, 3),
        sse_bytes_per_token=round(data / max(tokens, 1), 1),
    )


@contextlib.contextmanager
def bare_server(fixes: str) -> Iterator[tuple[str, int]]:
    """The bare Starlette + Hypercorn SSE app; yields ``(base_url, pid)``. ``fixes``:
    ``"fixes"`` installs servehall's Hypercorn connection fixes, ``"plain"`` does not."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-c", _BARE_APP, str(port), str(STEP_MS / 1000), fixes],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        assert proc.stdout is not None
        if proc.stdout.readline().strip() != b"ready":
            raise RuntimeError("the bare app did not start")
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError):
                httpx.post(base + "/v1/chat/completions", json={"max_tokens": 1}, timeout=2)
                break
            time.sleep(0.1)
        yield base, proc.pid
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def servehall_config(sink: str, isolation: str) -> dict[str, Any]:
    """The null-engine deployment measured here."""
    cfg: dict[str, Any] = {
        "models": [
            {
                "name": "null",
                "path": str(demo_dir()),
                "backend": "null",
                "isolation": isolation,
                "options": {"step_time_ms": STEP_MS, "max_num_seqs": MAX_NUM_SEQS},
            }
        ],
        "scheduler": {"max_concurrency": MAX_NUM_SEQS, "max_queue": 4096},
        "database": {"auto_migrate": True},
    }
    if sink == "none":
        cfg["sinks"] = []
    return cfg


def run_all(name: str, base: str, pid: int, args: argparse.Namespace, model: str) -> list[Row]:
    """Both workloads on one server."""
    url = base + "/v1/chat/completions"
    return [
        measure(
            name,
            f"{args.stream_tokens}-token streams x{args.streams}",
            url,
            pid,
            args.stream_tokens,
            args.stream_requests,
            args.streams,
            model,
        ),
        measure(
            name,
            f"1-token streams x{args.short_concurrency}",
            url,
            pid,
            1,
            args.short_requests,
            args.short_concurrency,
            model,
        ),
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--streams", type=int, default=256)
    ap.add_argument("--stream-tokens", type=int, default=64)
    ap.add_argument("--stream-requests", type=int, default=2048)
    ap.add_argument("--short-concurrency", type=int, default=64)
    ap.add_argument("--short-requests", type=int, default=4096)
    ap.add_argument("--sink", choices=["sql", "none"], default="sql")
    ap.add_argument("--isolation", choices=["process", "thread"], default="process")
    ap.add_argument("--no-bare", action="store_true")
    ap.add_argument(
        "--bare-plain",
        action="store_true",
        help="the bare app without servehall's Hypercorn connection fixes",
    )
    ap.add_argument("--no-servehall", action="store_true")
    ap.add_argument("--json", action="store_true", help="print the rows as JSON lines too")
    args = ap.parse_args()

    print(f"# {time.strftime('%Y-%m-%d %H:%M:%S %Z')}, load average {os.getloadavg()}")
    rows: list[Row] = []
    if not args.no_servehall:
        with serving(servehall_config(args.sink, args.isolation)) as srv:
            srv_: Server = srv
            rows += run_all("servehall", srv_.base_url, srv_.process.pid, args, "null")
    if not args.no_bare:
        with bare_server("plain" if args.bare_plain else "fixes") as (base, pid):
            rows += run_all("bare", base, pid, args, "bare")
    print(f"# after: load average {os.getloadavg()}")

    bare = {r.workload: r for r in rows if r.server == "bare"}
    hdr = (
        f"{'server':10} {'workload':26} {'ok/total':>11} {'req/s':>8} {'tok/s':>9} "
        f"{'API µs/tok':>10} {'API ms/req':>10} {'wrk µs/tok':>10} {'API core':>8} {'÷ bare':>7}"
    )
    print(hdr)
    for r in rows:
        b = bare.get(r.workload)
        ratio = f"{r.api_cpu_s / r.succeeded / (b.api_cpu_s / b.succeeded):.2f}" if b else "-"
        print(
            f"{r.server:10} {r.workload:26} {r.succeeded:>5}/{r.requests:<5} {r.req_per_s:>8.1f} "
            f"{r.tok_per_s:>9.1f} {r.api_us_per_token:>10.2f} {r.api_ms_per_request:>10.3f} "
            f"{r.worker_us_per_token:>10.2f} {r.api_core_share:>8.2f} {ratio:>7} "
            f"{r.sse_bytes_per_token:>9.1f}"
        )
    if args.json:
        for r in rows:
            print(json.dumps(asdict(r)))


if __name__ == "__main__":
    main()
