"""API-process CPU per streamed token and per one-token request (issue 38 item 2).

Usage: ``python bench/bench_api_cpu.py [--streams 256] [--stream-tokens 64]
[--stream-requests 2048] [--short-concurrency 64] [--short-requests 4096]
[--sink sql|none] [--isolation process|thread] [--api-processes 1,2]
[--connections N] [--step-ms 5] [--stagger-ms MS] [--py-spy DIR] [--no-bare]
[--bare-plain] [--no-servehall] [--json]``

Several API processes (issue 38 item 3), the one command::

    python bench/bench_api_cpu.py --api-processes 1,2 --no-bare --stagger-ms 20

serves the same ``null`` deployment once per count (``[server] api_processes = N``),
one after the other, all with the same h2load shape: ``--connections`` (default 8
with ``--api-processes``; one connection per 64 streams otherwise, the single-process
method) — the kernel hands each connection to one frontend, so several connections
are needed to load several, and ``--stagger-ms`` opens them one at a time: a burst of
connections is accepted by the one frontend that wakes first (the connections per
process are printed). A second table splits the CPU by process: the primary,
each frontend (``frontend 1`` … in pid order), the engine worker, and the sum, per
token (streams) or per request (one-token streams); the last lines give each count's
rate ÷ the first count's. ``--py-spy DIR`` then profiles (200 Hz, raw collapsed
stacks into DIR, top frames printed) the primary and two frontends during one more,
unmeasured run of each workload, so the profiler does not slow the measured one.

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
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _serve import Server, demo_dir, serving

from servehall.bench.processes import (
    PRIMARY,
    WORKER,
    api_cpu_s,
    connections_by_role,
    cpu_by_role,
    h2load_args,
    h2load_shape,
    parse_api_processes,
    process_roles_cpu_s,
    self_by_library,
    top_frames,
)
from servehall.testing.sockets import free_port

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
    api_processes: int = 1
    cpu_by_process: dict[str, float] | None = None
    connections_by_process: dict[str, int] | None = None
    client_cpu_s: float = 0.0


_FINISHED = re.compile(r"finished in ([\d.]+)(m?s), ([\d.]+) req/s")
_REQUESTS = re.compile(r"requests: (\d+) total, \d+ started, \d+ done, (\d+) succeeded")
_DATA = re.compile(r"traffic: .*?, [\d.]+\w*B \((\d+)\) data")


def _children_cpu_s() -> float:
    """User + system seconds of this process's reaped children (``RUSAGE_CHILDREN``)."""
    import resource

    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def h2load(
    url: str,
    body: Path,
    n: int,
    concurrency: int,
    connections: int | None = None,
    during: Callable[[], None] | None = None,
    stagger_ms: float = 0.0,
) -> tuple[int, int, float, int, float]:
    """Run h2load: ``n`` POSTs of ``body``, ``concurrency`` streams at once over
    ``connections`` connections (None: at most 64 streams per connection;
    :func:`servehall.bench.processes.h2load_shape`). Returns ``(requests, succeeded,
    elapsed_s, data_bytes, client_cpu_s)`` (``data_bytes``: response body bytes received,
    h2load's ``data`` traffic; ``client_cpu_s``: h2load's own CPU seconds).
    ``stagger_ms``: one new connection every so many ms
    (:func:`servehall.bench.processes.h2load_args`). ``during()`` is called once, 0.3 s
    into the run (while h2load's connections are open)."""
    cmd = [
        shutil.which("h2load") or "/usr/bin/h2load",
        "-n",
        str(n),
        *h2load_args(concurrency, connections, stagger_ms),
        "-d",
        str(body),
        "-H",
        "content-type: application/json",
        url,
    ]
    cpu0 = _children_cpu_s()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if during is not None:
        time.sleep(0.3)
        during()
    try:
        stdout, stderr = proc.communicate(timeout=900)
    except subprocess.TimeoutExpired:
        proc.kill()
        stdout, stderr = proc.communicate()
    res = subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr)
    client_cpu_s = _children_cpu_s() - cpu0
    fin = _FINISHED.search(res.stdout)
    req = _REQUESTS.search(res.stdout)
    if fin is None or req is None:
        raise RuntimeError(f"h2load output not understood:\n{res.stdout}\n{res.stderr}")
    elapsed = float(fin.group(1)) / (1000 if fin.group(2) == "ms" else 1)
    data = _DATA.search(res.stdout)
    nbytes = int(data.group(1)) if data else 0
    return int(req.group(1)), int(req.group(2)), elapsed, nbytes, client_cpu_s


def measure(
    name: str,
    workload: str,
    url: str,
    api_pid: int,
    max_tokens: int,
    n: int,
    concurrency: int,
    model: str,
    connections: int | None = None,
    api_processes: int = 1,
    py_spy: Path | None = None,
    stagger_ms: float = 0.0,
) -> Row:
    """Warm up, then one measured h2load run with CPU taken around it (by process:
    :func:`servehall.bench.processes.cpu_by_role`); with ``py_spy``, one more run
    profiled (:func:`profile`)."""
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
    h2load(url, body, max(concurrency, n // 8), concurrency, connections, None, stagger_ms)
    port = int(url.split(":")[2].split("/")[0])
    conns: dict[str, int] = {}
    before = process_roles_cpu_s(api_pid)
    total, ok, elapsed, data, client_cpu = h2load(
        url,
        body,
        n,
        concurrency,
        connections,
        lambda: conns.update(connections_by_role(api_pid, port)),
        stagger_ms,
    )
    by_process = cpu_by_role(before, process_roles_cpu_s(api_pid))
    if ok < total:
        print(f"  ! {name} {workload}: {total - ok} of {total} requests failed", file=sys.stderr)
    if py_spy is not None:
        profile(
            py_spy,
            f"{name}-{workload}",
            api_pid,
            lambda: h2load(url, body, n, concurrency, connections, None, stagger_ms),
        )
    tokens = ok * max_tokens
    api, wk = api_cpu_s(by_process), by_process[WORKER]
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
        api_processes=api_processes,
        cpu_by_process={k: round(v, 3) for k, v in by_process.items()},
        connections_by_process=conns,
        client_cpu_s=round(client_cpu, 3),
    )


def profile(out_dir: Path, tag: str, api_pid: int, load: Any, seconds: float = 10.0) -> None:
    """py-spy (200 Hz, ``--format raw``, ``--nonblocking``) on the primary and on
    ``frontend 1`` and ``frontend 2`` (the two lowest-pid frontends, if any) for
    ``seconds`` while ``load()`` runs (again and again until py-spy ends); the stacks go
    to ``out_dir/<tag>-<process>.txt`` and the top innermost frames are printed. Skipped,
    with a line, without py-spy."""
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(spy).exists():
        print("  ! --py-spy: py-spy not found (pip install 'servehall[bench]')", file=sys.stderr)
        return
    out_dir.mkdir(parents=True, exist_ok=True)
    roles = process_roles_cpu_s(api_pid)
    frontends = sorted(p for p, (role, _) in roles.items() if role == "frontend")
    targets = [(PRIMARY, api_pid)] + [(f"frontend-{i}", f) for i, f in enumerate(frontends[:2], 1)]
    safe = re.sub(r"[^A-Za-z0-9=.-]+", "_", tag)
    spies = []
    for label, pid in targets:
        path = out_dir / f"{safe}-{label}.txt"
        cmd = [spy, "record", "-p", str(pid), "-d", str(int(seconds)), "-r", "200"]
        cmd += ["-f", "raw", "--nonblocking", "-o", str(path)]
        spies.append(
            (label, path, subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE))
        )
    time.sleep(1.0)  # py-spy attaches
    while any(proc.poll() is None for _, _, proc in spies):
        load()  # again until py-spy is done: the profile covers load only
    for label, path, proc in spies:
        try:
            _, err = proc.communicate(timeout=seconds + 30)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
        if not path.exists():
            print(
                f"  ! py-spy {label}: {err.decode(errors='replace').strip()[-300:]}",
                file=sys.stderr,
            )
            continue
        samples, own, _ = top_frames(path.read_text(errors="replace"), 12)
        print(f"# py-spy {tag} {label} (pid {dict(targets)[label]}): {samples} samples -> {path}")
        for frame, n in own:
            print(f"#   self {100 * n / max(samples, 1):5.1f}%  {frame}")
        libs = self_by_library(path.read_text(errors="replace"))
        print(
            "#   self by library: "
            + ", ".join(f"{lib} {100 * n / max(samples, 1):.1f}%" for lib, n in libs[:10])
        )


@contextlib.contextmanager
def bare_server(fixes: str, step_ms: float = STEP_MS) -> Iterator[tuple[str, int]]:
    """The bare Starlette + Hypercorn SSE app; yields ``(base_url, pid)``. ``fixes``:
    ``"fixes"`` installs servehall's Hypercorn connection fixes, ``"plain"`` does not."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-c", _BARE_APP, str(port), str(step_ms / 1000), fixes],
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


def servehall_config(
    sink: str, isolation: str, api_processes: int = 1, step_ms: float = STEP_MS
) -> dict[str, Any]:
    """The null-engine deployment measured here, with ``[server] api_processes`` and
    ``step_ms`` per engine step."""
    cfg: dict[str, Any] = {
        "models": [
            {
                "name": "null",
                "path": str(demo_dir()),
                "backend": "null",
                "isolation": isolation,
                "options": {"step_time_ms": step_ms, "max_num_seqs": MAX_NUM_SEQS},
            }
        ],
        "scheduler": {"max_concurrency": MAX_NUM_SEQS, "max_queue": 4096},
        "database": {"auto_migrate": True},
        "server": {"api_processes": api_processes},
    }
    if sink == "none":
        cfg["sinks"] = []
    return cfg


def run_all(
    name: str,
    base: str,
    pid: int,
    args: argparse.Namespace,
    model: str,
    api_processes: int = 1,
    py_spy: Path | None = None,
) -> list[Row]:
    """Both workloads on one server."""
    url = base + "/v1/chat/completions"
    extra = {
        "connections": args.connections,
        "api_processes": api_processes,
        "py_spy": py_spy,
        "stagger_ms": args.stagger_ms,
    }
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
            **extra,
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
            **extra,
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
    ap.add_argument(
        "--api-processes",
        type=parse_api_processes,
        default=None,
        metavar="N[,N...]",
        help="serve once per count ([server] api_processes = N), e.g. 1,2 (default: 1)",
    )
    ap.add_argument(
        "--connections",
        type=int,
        default=None,
        help="h2load connections (-c); default 8 with --api-processes, else one per 64 streams",
    )
    ap.add_argument(
        "--step-ms",
        type=float,
        default=STEP_MS,
        help="the null engine's (and the bare app's) step time; 256 sequences per step "
        "(default 5: 51,200 tok/s nominal; 2.5: 102,400)",
    )
    ap.add_argument(
        "--stagger-ms",
        type=float,
        default=0.0,
        help="open h2load's connections one every this many ms (h2load -r 1 --rate-period) "
        "instead of all at once: a burst is accepted by one frontend",
    )
    ap.add_argument(
        "--py-spy",
        type=Path,
        default=None,
        metavar="DIR",
        help="profile the primary and two frontends in one more run of each workload",
    )
    ap.add_argument("--json", action="store_true", help="print the rows as JSON lines too")
    args = ap.parse_args()

    print(f"# {time.strftime('%Y-%m-%d %H:%M:%S %Z')}, load average {os.getloadavg()}")
    nominal = MAX_NUM_SEQS * 1000 / args.step_ms
    print(
        f"# null engine: {MAX_NUM_SEQS} sequences, {args.step_ms:g} ms steps ({nominal:,.0f} tok/s)"
    )
    counts = args.api_processes or [1]
    if args.api_processes is not None and args.connections is None:
        args.connections = 8
    shape = {
        w: h2load_shape(c, args.connections)
        for w, c in (("streams", args.streams), ("short", args.short_concurrency))
    }
    print(
        f"# h2load -c/-m: streams {shape['streams']}, one-token {shape['short']}; "
        f"connections opened {f'one per {args.stagger_ms:g} ms' if args.stagger_ms else 'at once'}"
    )
    rows: list[Row] = []
    if not args.no_servehall:
        for n in counts:
            name = "servehall" if args.api_processes is None else f"servehall N={n}"
            with serving(servehall_config(args.sink, args.isolation, n, args.step_ms)) as srv:
                srv_: Server = srv
                wait_frontends(srv_.process.pid, n)
                rows += run_all(name, srv_.base_url, srv_.process.pid, args, "null", n, args.py_spy)
    if not args.no_bare:
        with bare_server("plain" if args.bare_plain else "fixes", args.step_ms) as (base, pid):
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
    if args.api_processes is not None:
        print_by_process(rows)
    if args.json:
        for r in rows:
            print(json.dumps(asdict(r)))


def wait_frontends(pid: int, n: int, timeout_s: float = 30.0) -> None:
    """Wait until the serve process ``pid`` has its ``n`` frontends (none when ``n`` is
    1). Raises RuntimeError when they are not there within ``timeout_s``."""
    want = 0 if n == 1 else n
    deadline = time.monotonic() + timeout_s
    while True:
        got = sum(role == "frontend" for role, _ in process_roles_cpu_s(pid).values())
        if got == want:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"serve process {pid}: {got} frontends, expected {want}")
        time.sleep(0.2)


def print_by_process(rows: list[Row]) -> None:
    """CPU per token (streams) or per request (one-token streams) of each process of
    each server, summed, and each server's rates ÷ the first server's on the same
    workload."""
    print("\nCPU by process: µs per token (streams), ms per request (one-token streams)")
    for r in rows:
        if r.cpu_by_process is None:
            continue
        per_tok = not r.workload.startswith("1-token")
        div = (r.succeeded * int(r.workload.split("-")[0])) / 1e6 if per_tok else r.succeeded / 1e3
        parts = [f"{k} {v / max(div, 1e-9):.2f}" for k, v in r.cpu_by_process.items()]
        total = sum(r.cpu_by_process.values()) / max(div, 1e-9)
        unit = "µs/tok" if per_tok else "ms/req"
        cores = sum(r.cpu_by_process.values()) / max(r.seconds, 1e-9)
        conns = ", ".join(f"{k} {v}" for k, v in (r.connections_by_process or {}).items() if v)
        print(
            f"  {r.server:15} {r.workload:26} {unit}: "
            + ", ".join(parts)
            + f", sum {total:.2f} ({cores:.2f} cores; h2load "
            + f"{r.client_cpu_s / max(r.seconds, 1e-9):.2f}); connections: {conns or '-'}"
        )
    first: dict[str, Row] = {}
    for r in rows:
        if r.server.startswith("servehall"):
            first.setdefault(r.workload, r)
    print("\nRates ÷ the first server's (same workload)")
    for r in rows:
        b = first.get(r.workload)
        if b is None or b is r or not r.server.startswith("servehall"):
            continue
        print(
            f"  {r.server:15} {r.workload:26} tok/s x{r.tok_per_s / max(b.tok_per_s, 1e-9):.2f}, "
            f"req/s x{r.req_per_s / max(b.req_per_s, 1e-9):.2f}  (vs {b.server})"
        )


if __name__ == "__main__":
    main()
