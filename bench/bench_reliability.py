"""servehall's reliability benchmark: load and faults, one command, figures printed.

Usage::

    python bench/bench_reliability.py [PART ...] [--seconds S] [--requests N]

Parts (all by default, in this order), each against a real ``servehall serve`` on the
demo model (``bench/_serve.py``):

* ``big-prompt`` (N31) — ``/health/live`` polled every 20 ms and one streamed
  completion running, first alone (the baseline), then while a chat request with
  ``"word "`` × 419,000 (≈ 2 MB) arrives, then four at once. Prints the longest wait of a
  health poll and the longest gap between two SSE events, baseline vs. with the big
  prompts, the big prompts' statuses, and resident memory before/after (+5 s).
* ``abort`` (C19L) — two CPU burners beside the server; 20 × two concurrent streamed
  completions (``max_tokens`` 1000) closed after their first event. Prints the rows
  (status, finish reason), the tokens generated per closed stream, the abort counter's
  rise and the ``socket.send() raised exception`` lines in the server log.
* ``outage`` (P03, round 1) — short chat requests at up to 300 req/s for ``--seconds``
  (default 6); a private PostgreSQL cluster (``servehall.db.testing.PgCluster``) is
  stopped for 2 s in the middle. Prints the achieved rate, the statuses and whether
  every answered request has exactly one ``request_log`` row afterwards.
* ``bad-input`` — ``--requests`` (default 2000) requests cycling through malformed
  bodies (broken JSON, wrong types, NaN, lone surrogates, huge messages, wrong media
  type, unknown model); prints the status histogram (no 5xx expected) and the rate.
* ``churn`` — 400 connections, each one ``/health/live`` request then closed (HTTP/1.1,
  then h2c); prints the rate and the server's sockets in CLOSE-WAIT 1 s later (it only
  measures: connection handling is another issue's work).
* ``memory`` — ``--requests`` (default 4000; the round-1 run used 40,000) short chat
  requests; prints the server's RSS at each quarter.

Figures depend on the machine; the docs say which one. Not part of the test suite.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).parent))
from _serve import Server, config, serving

CHAT = {"model": "demo", "max_tokens": 1, "messages": [{"role": "user", "content": "Hi"}]}
BIG = {
    "model": "demo",
    "max_tokens": 8,
    "messages": [{"role": "user", "content": "word " * 419_000}],
}
MiB = 1024 * 1024


# --- big-prompt (N31) ------------------------------------------------------------------


def _watch(srv: Server, during: Callable[[], Any]) -> dict[str, Any]:
    """Poll health every 20 ms and run a stream while ``during()`` runs."""
    stop = threading.Event()
    waits: list[float] = []
    gaps: list[float] = []

    def poll() -> None:
        with httpx.Client(base_url=srv.base_url, timeout=60) as c:
            while not stop.is_set():
                t0 = time.perf_counter()
                c.get("/health/live")
                waits.append(time.perf_counter() - t0)
                time.sleep(0.02)

    def stream() -> None:
        body = {"model": "demo", "prompt": "ABCDEFGH", "max_tokens": 1900, "stream": True}
        with (
            httpx.Client(base_url=srv.base_url, timeout=60) as c,
            c.stream("POST", "/v1/completions", json={**body, "temperature": 0}) as r,
        ):
            last = None
            for line in r.iter_lines():
                now = time.perf_counter()
                if line.startswith("data: "):
                    if last is not None:
                        gaps.append(now - last)
                    last = now
                if stop.is_set():
                    break

    threads = [threading.Thread(target=poll), threading.Thread(target=stream)]
    for t in threads:
        t.start()
    time.sleep(0.3)
    result = during()
    time.sleep(0.3)
    stop.set()
    for t in threads:
        t.join()
    return {
        "result": result,
        "health_max_ms": max(waits) * 1000,
        "health_p50_ms": statistics.median(waits) * 1000,
        "stream_gap_max_ms": max(gaps) * 1000 if gaps else float("nan"),
    }


def big_prompt(srv: Server) -> None:
    # The big bodies are sent by curl processes, so that the client's own CPU work (JSON
    # encoding, sending 2 MB) cannot delay this process's health polls and stream.
    body_file = Path(tempfile.mkdtemp(prefix="servehall-big-")) / "big.json"
    body_file.write_bytes(json.dumps(BIG).encode())
    url = srv.base_url + "/v1/chat/completions"
    curl = ["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}"]
    curl += ["-H", "Content-Type: application/json", "--data-binary", f"@{body_file}", url]

    def big(n: int) -> list[int]:
        procs = [subprocess.Popen(curl, stdout=subprocess.PIPE, text=True) for _ in range(n)]
        return [int(p.communicate()[0] or 0) for p in procs]

    big(1)  # warm-up
    time.sleep(1)
    rss0 = srv.rss_bytes()
    base = _watch(srv, lambda: time.sleep(1.5))
    with_big = _watch(srv, lambda: big(1) + big(4))
    rss1 = srv.rss_bytes()
    time.sleep(5)
    rss2 = srv.rss_bytes()
    print("big-prompt (N31): 2 MB chat prompts, 1 then 4 at once")
    print(f"  statuses: {Counter(with_big['result'])}")
    for key in ("health_max_ms", "health_p50_ms", "stream_gap_max_ms"):
        b, w = base[key], with_big[key]
        print(f"  {key:18s} baseline {b:8.1f}  with big prompts {w:8.1f}  ratio {w / b:5.2f}")
    print(
        f"  RSS before {rss0 / MiB:.0f} MiB, right after {rss1 / MiB:.0f} MiB, "
        f"+5 s {rss2 / MiB:.0f} MiB (delta {(rss2 - rss0) / MiB:+.0f} MiB)"
    )


# --- abort (C19L) ----------------------------------------------------------------------


def _drop_after_first_event(port: int, body: dict[str, Any]) -> None:
    data = json.dumps(body).encode()
    with socket.create_connection(("127.0.0.1", port), timeout=60) as s:
        s.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + b"Content-Length: %d\r\n\r\n" % len(data)
            + data
        )
        got = b""
        while b"data: " not in got:
            chunk = s.recv(4096)
            if not chunk:
                return
            got += chunk


def _aborts(srv: Server) -> float:
    text = httpx.get(srv.base_url + "/metrics", timeout=30).text
    m = re.search(r'aborts_total\{model="demo",reason="client_disconnect"\} ([0-9.e+]+)', text)
    return float(m.group(1)) if m else 0.0


def abort(srv: Server, db: Path) -> None:
    body = {"model": "demo", "prompt": "ABCDEFGH ABCDEFGH ABC", "temperature": 0}
    body |= {"max_tokens": 1000, "stream": True}
    before = _aborts(srv)
    warn0 = srv.log_text().count("socket.send() raised exception")
    n0 = (
        sqlite3.connect(db)
        .execute("SELECT count(*) FROM request_log WHERE endpoint = '/v1/completions'")
        .fetchone()[0]
    )
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        for _ in range(20):
            pair = [
                threading.Thread(target=_drop_after_first_event, args=(srv.port, body))
                for _ in range(2)
            ]
            for t in pair:
                t.start()
            for t in pair:
                t.join()
    finally:
        for b in burners:
            b.kill()
    sql = (
        "SELECT status_code, finish_reason, completion_tokens FROM request_log "
        "WHERE endpoint = '/v1/completions' ORDER BY received_at"
    )
    end = time.monotonic() + 30
    while True:  # the sink writes in batches: wait for the 40 rows
        rows = sqlite3.connect(db).execute(sql).fetchall()[n0:]
        if len(rows) >= 40 or time.monotonic() > end:
            break
        time.sleep(0.2)
    tokens = sorted(r[2] for r in rows)
    print("abort (C19L): 2 CPU burners, 20 x 2 streams closed after the first event")
    print(f"  rows: {len(rows)} {dict(Counter((r[0], r[1]) for r in rows))}")
    if tokens:
        print(
            f"  tokens per closed stream: median {statistics.median(tokens):.0f}, "
            f"max {tokens[-1]} (of 1000)"
        )
    print(f"  abort counter +{_aborts(srv) - before:.0f}")
    warns = srv.log_text().count("socket.send() raised exception") - warn0
    print(f"  'socket.send() raised exception' lines: {warns}")


# --- bad input -------------------------------------------------------------------------

BAD: list[tuple[bytes, str]] = [
    (b"{", "application/json"),
    (b"[]", "application/json"),
    (b"null", "application/json"),
    (b"", "application/json"),
    (b'{"model": "demo", "messages": "x"}', "application/json"),
    (
        b'{"model": "demo", "messages": [{"role": "user", "content": "x"}], "temperature": NaN}',
        "application/json",
    ),
    (
        b'{"model": "demo", "messages": [{"role": "user", "content": "\\ud83d"}]}',
        "application/json",
    ),
    (b'{"model": "demo", "messages": [{"role": "wizard", "content": "x"}]}', "application/json"),
    (b'{"model": "nope", "messages": [{"role": "user", "content": "x"}]}', "application/json"),
    (
        b'{"model": "demo", "messages": [{"role": "user", "content": "x"}], "max_tokens": -1}',
        "application/json",
    ),
    (
        json.dumps(
            {"model": "demo", "messages": [{"role": "user", "content": 12345}] * 5000}
        ).encode(),
        "application/json",
    ),
    (b'{"model": "demo"}', "text/plain"),
    (b"[" * 10000 + b"]" * 10000, "application/json"),
]


async def _bad_input(srv: Server, n: int) -> tuple[Counter[int], float]:
    statuses: Counter[int] = Counter()
    sem = asyncio.Semaphore(16)
    async with httpx.AsyncClient(base_url=srv.base_url, http2=True, http1=False, timeout=60) as c:

        async def one(i: int) -> None:
            body, ctype = BAD[i % len(BAD)]
            async with sem:
                r = await c.post(
                    "/v1/chat/completions", content=body, headers={"content-type": ctype}
                )
                statuses[r.status_code] += 1

        t0 = time.perf_counter()
        await asyncio.gather(*(one(i) for i in range(n)))
        return statuses, n / (time.perf_counter() - t0)


def bad_input(srv: Server, n: int) -> None:
    statuses, rate = asyncio.run(_bad_input(srv, n))
    ok = httpx.post(srv.base_url + "/v1/chat/completions", json=CHAT, timeout=60).status_code
    print(f"bad-input: {n} malformed requests at {rate:.0f} req/s")
    print(f"  statuses: {dict(sorted(statuses.items()))}; a valid request right after: {ok}")


# --- churn -----------------------------------------------------------------------------


def _close_wait(port: int) -> int:
    out = subprocess.run(["ss", "-tan"], capture_output=True, text=True).stdout
    return sum(1 for line in out.splitlines() if "CLOSE-WAIT" in line and f":{port} " in line)


def churn(srv: Server, n: int = 400) -> None:
    import h2.config
    import h2.connection

    t0 = time.perf_counter()
    for _ in range(n // 2):
        with socket.create_connection(("127.0.0.1", srv.port), timeout=30) as s:
            s.sendall(b"GET /health/live HTTP/1.1\r\nHost: x\r\n\r\n")
            s.recv(4096)
    for _ in range(n // 2):
        conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
        conn.initiate_connection()
        conn.send_headers(
            1,
            [
                (":method", "GET"),
                (":path", "/health/live"),
                (":scheme", "http"),
                (":authority", "x"),
            ],
            end_stream=True,
        )
        with socket.create_connection(("127.0.0.1", srv.port), timeout=30) as s:
            s.sendall(conn.data_to_send())
            s.recv(4096)
    rate = n / (time.perf_counter() - t0)
    time.sleep(1)
    print(f"churn: {n} connections (h1, then h2c), one request each, at {rate:.0f} conn/s")
    print(f"  server sockets in CLOSE-WAIT 1 s later: {_close_wait(srv.port)}")


# --- memory ----------------------------------------------------------------------------


async def _memory(srv: Server, n: int) -> list[tuple[int, int]]:
    marks: list[tuple[int, int]] = [(0, srv.rss_bytes())]
    done = 0
    sem = asyncio.Semaphore(8)
    async with httpx.AsyncClient(base_url=srv.base_url, http2=True, http1=False, timeout=60) as c:

        async def one(i: int) -> None:
            nonlocal done
            async with sem:
                await c.post(
                    "/v1/chat/completions",
                    json={**CHAT, "messages": [{"role": "user", "content": f"Hi {i}"}]},
                )
            done += 1
            if done % (n // 4) == 0:
                marks.append((done, srv.rss_bytes()))

        await asyncio.gather(*(one(i) for i in range(n)))
    return marks


def memory(srv: Server, n: int) -> None:
    t0 = time.perf_counter()
    marks = asyncio.run(_memory(srv, n))
    rate = n / (time.perf_counter() - t0)
    print(f"memory: {n} short chat requests at {rate:.0f} req/s; RSS (MiB) by requests done:")
    print("  " + ", ".join(f"{k}: {v / MiB:.0f}" for k, v in marks))


# --- outage ----------------------------------------------------------------------------


async def _outage_load(srv: Server, seconds: float, cluster: Any) -> tuple[list[int], float]:
    statuses: list[int] = []
    stop = asyncio.Event()
    interval = 1 / 300

    async def client(k: int) -> None:
        async with httpx.AsyncClient(
            base_url=srv.base_url, http2=True, http1=False, timeout=60
        ) as c:
            i = 0
            while not stop.is_set():
                t0 = time.perf_counter()
                r = await c.post(
                    "/v1/chat/completions",
                    json={**CHAT, "messages": [{"role": "user", "content": f"o {k} {i}"}]},
                )
                statuses.append(r.status_code)
                i += 1
                await asyncio.sleep(max(0.0, 16 * interval - (time.perf_counter() - t0)))

    t0 = time.perf_counter()
    tasks = [asyncio.create_task(client(k)) for k in range(16)]
    await asyncio.sleep((seconds - 2) / 2)
    await asyncio.to_thread(cluster.stop, "fast")
    await asyncio.sleep(2)
    await asyncio.to_thread(cluster.start)
    await asyncio.sleep((seconds - 2) / 2)
    stop.set()
    await asyncio.gather(*tasks)
    return statuses, len(statuses) / (time.perf_counter() - t0)


def outage(seconds: float) -> None:
    from servehall.db import create_db_engine
    from servehall.db.migrate import upgrade_database
    from servehall.db.testing import PgCluster, pg_bin_dir, run_sql

    if pg_bin_dir() is None:
        print("outage: skipped (PostgreSQL server binaries not installed)")
        return
    cluster = PgCluster().init()
    cluster.start()
    try:

        async def migrate() -> None:
            engine = create_db_engine(cluster.url)
            await upgrade_database(engine)
            await engine.dispose()

        asyncio.run(migrate())
        cfg = config(
            database={"url": cluster.url},
            sinks=[{"name": "sql", "options": {"retry_initial_s": 0.05, "retry_max_s": 0.3}}],
            scheduler={"max_concurrency": 8, "max_queue": 256},
        )
        with serving(cfg) as srv:
            statuses, rate = asyncio.run(_outage_load(srv, seconds, cluster))
            answered = len(statuses)
            end = time.monotonic() + 60
            rows = 0
            while time.monotonic() < end:
                rows = asyncio.run(run_sql(cluster.url, "SELECT count(*) FROM request_log"))[0][0]
                if rows >= answered:
                    break
                time.sleep(0.5)
        print(f"outage: {seconds:.0f} s of chat requests (target 300 req/s), PostgreSQL down 2 s")
        print(f"  achieved {rate:.0f} req/s; statuses {dict(Counter(statuses))}")
        print(f"  answered {answered}, request_log rows {rows} (lost: {answered - rows})")
    finally:
        cluster.destroy()


# --- main ------------------------------------------------------------------------------

PARTS = ("big-prompt", "abort", "outage", "bad-input", "churn", "memory")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("parts", nargs="*", metavar="PART", help=", ".join(PARTS))
    ap.add_argument("--seconds", type=float, default=6.0, help="outage run length")
    ap.add_argument("--requests", type=int, default=None, help="bad-input/memory requests")
    args = ap.parse_args()
    parts = args.parts or list(PARTS)
    unknown = set(parts) - set(PARTS)
    if unknown:
        ap.error(f"unknown part(s): {', '.join(sorted(unknown))}; known: {', '.join(PARTS)}")
    print(f"servehall reliability benchmark: {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}")
    tmp = Path(tempfile.mkdtemp(prefix="servehall-rel-"))
    db = tmp / "records.db"
    shared = [p for p in parts if p != "outage"]
    if shared:
        cfg = config(
            database={"url": f"sqlite+aiosqlite:///{db}", "auto_migrate": True},
            sinks=[{"name": "sql", "options": {"linger_s": 0.01}}],
            scheduler={"max_concurrency": 8, "max_queue": 256},
        )
        with serving(cfg) as srv:
            for part in shared:
                if part == "big-prompt":
                    big_prompt(srv)
                elif part == "abort":
                    abort(srv, db)
                elif part == "bad-input":
                    bad_input(srv, args.requests or 2000)
                elif part == "churn":
                    churn(srv)
                elif part == "memory":
                    memory(srv, args.requests or 4000)
    if "outage" in parts:
        outage(args.seconds)


if __name__ == "__main__":
    main()
