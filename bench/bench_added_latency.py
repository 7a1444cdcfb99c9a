"""Added latency of the platform on a one-token request, side by side in one run.

Issue 9's latency target: the whole platform adds at most 1 ms (P50) and 3 ms (P99) to a
one-token request over what the parts it cannot avoid need — an HTTP/2 round trip to a
bare Hypercorn route and the raw engine producing one token. This script measures the
three in one run, alternating them ``--rounds`` times so a change in the machine's load
hits all three:

* ``bare``: Hypercorn (the server servehall runs on) serving a one-route ASGI app that
  reads the body and answers a small JSON object; no servehall code. Same client.
* ``engine``: the model's engine in this process (the ``[[models]]`` entry of the
  deployment, started as ``servehall bench engine`` does), one greedy token from the
  tokenized prompt, awaited to its finish delta.
* ``servehall``: ``servehall serve`` on the same model (``isolation = "process"``, the
  default; ``--isolation thread`` runs the engine in the API process), ``POST
  /v1/completions`` with ``max_tokens = 1``; ``--sink sqlite`` adds the
  embedded SQLite request log (the default deployment), else no sink.

Each target gets ``--warmup`` unmeasured requests, then ``-n`` sequential ones over one
h2c connection (httpx). Prints a table per round and, over all rounds, P50/P99 of each
target and ``added = servehall − (bare + engine)`` (P50 and P99 taken per target, then
subtracted — an upper-bound style comparison, as the issue states it).

Usage: ``.venv/bin/python bench/bench_added_latency.py [--model-dir DIR] [-n 500]
[--rounds 3] [--sink none|sqlite] [--json FILE]``. A quiet machine is needed for
absolute numbers; the comparison holds within one run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from servehall.bench.metrics import percentile  # noqa: E402
from tests.conftest import demo_config, dump_toml, free_port, start_server  # noqa: E402

PROMPT = "hello"
BODY = {"model": "demo", "prompt": PROMPT, "max_tokens": 1, "temperature": 0}

BARE_APP = """
import asyncio
from hypercorn.asyncio import serve
from hypercorn.config import Config

async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    while True:
        message = await receive()
        if not message.get("more_body"):
            break
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": b'{"ok": true}'})

config = Config()
config.bind = ["127.0.0.1:%d"]
asyncio.run(serve(app, config))
"""


async def http_one_token(base_url: str, n: int, warmup: int) -> list[float]:
    """Milliseconds of ``n`` sequential one-token completions over one h2c connection."""
    out: list[float] = []
    async with httpx.AsyncClient(base_url=base_url, http1=False, http2=True, timeout=60) as c:
        for i in range(warmup + n):
            t = time.perf_counter()
            r = await c.post("/v1/completions", json=BODY)
            elapsed = (time.perf_counter() - t) * 1000
            r.raise_for_status()
            if i >= warmup:
                out.append(elapsed)
    return out


def bare(n: int, warmup: int) -> list[float]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-c", BARE_APP % port],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError("bare Hypercorn did not start") from None
                time.sleep(0.05)
        return asyncio.run(http_one_token(f"http://127.0.0.1:{port}", n, warmup))
    finally:
        proc.terminate()
        proc.wait(10)


async def engine(config: Path, n: int, warmup: int) -> list[float]:
    from servehall.bench.engine_driver import loaded_engine
    from servehall.engines.contract import SamplingParams

    out: list[float] = []
    params = SamplingParams(max_tokens=1, temperature=0.0)
    async with loaded_engine(config, "demo") as le:
        ids = le.tokenizer.encode_plain(PROMPT, add_special_tokens=True)
        for i in range(warmup + n):
            t = time.perf_counter()
            async for delta in le.engine.add_request(f"r{i}", ids, params):
                if delta.finish_reason:
                    break
            elapsed = (time.perf_counter() - t) * 1000
            if i >= warmup:
                out.append(elapsed)
    return out


def servehall(cfg: dict[str, Any], work: Path, n: int, warmup: int) -> list[float]:
    srv = start_server(cfg, work, name="latency")
    try:
        return asyncio.run(http_one_token(srv.base_url, n, warmup))
    finally:
        srv.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--model-dir", type=Path, default=None, help="default: the demo model")
    ap.add_argument("-n", type=int, default=500, help="measured requests per target and round")
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--sink", choices=("none", "sqlite"), default="none")
    ap.add_argument(
        "--isolation",
        choices=("process", "thread"),
        default="process",
        help="[[models]] isolation of the servehall target (default: process)",
    )
    ap.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = ap.parse_args()
    from servehall.demo import DEFAULT_DEMO_DIR, build_demo_model

    model = args.model_dir or Path(build_demo_model(DEFAULT_DEMO_DIR))
    work = Path(tempfile.mkdtemp(prefix="servehall-latency-"))
    cfg = demo_config(model)
    cfg["models"][0]["isolation"] = args.isolation
    if args.sink == "sqlite":
        cfg["database"] = {"url": f"sqlite+aiosqlite:///{work / 'servehall.db'}"}
        cfg["database"]["auto_migrate"] = True
        cfg["sinks"] = [{"name": "sql"}]
    config_path = work / "engine.toml"
    config_path.write_text(dump_toml(cfg))

    samples: dict[str, list[float]] = {"bare": [], "engine": [], "servehall": []}
    rounds: list[dict[str, Any]] = []
    for k in range(args.rounds):
        got = {
            "bare": bare(args.n, args.warmup),
            "engine": asyncio.run(engine(config_path, args.n, args.warmup)),
            "servehall": servehall(cfg, work / f"round{k}", args.n, args.warmup),
        }
        row = {name: (percentile(v, 50), percentile(v, 99)) for name, v in got.items()}
        rounds.append(row)
        for name, v in got.items():
            samples[name].extend(v)
        print(
            f"round {k + 1}: "
            + "  ".join(
                f"{name} P50 {p50:.2f} / P99 {p99:.2f} ms" for name, (p50, p99) in row.items()
            ),
            flush=True,
        )
    summary = {
        name: {"p50_ms": percentile(v, 50), "p99_ms": percentile(v, 99)}
        for name, v in samples.items()
    }
    added = {
        q: summary["servehall"][q] - summary["bare"][q] - summary["engine"][q]
        for q in ("p50_ms", "p99_ms")
    }
    print()
    print(f"{'target':<10} {'P50 ms':>8} {'P99 ms':>8}")
    for name, s in summary.items():
        print(f"{name:<10} {s['p50_ms']:>8.2f} {s['p99_ms']:>8.2f}")
    print(
        f"{'added':<10} {added['p50_ms']:>8.2f} {added['p99_ms']:>8.2f}"
        "   (servehall - bare - engine; target <= 1 / 3 ms)"
    )
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "n": args.n,
                    "rounds": args.rounds,
                    "sink": args.sink,
                    "per_round": rounds,
                    "summary": summary,
                    "added": added,
                    "cpus": os.cpu_count(),
                },
                indent=2,
            )
        )


if __name__ == "__main__":
    main()
