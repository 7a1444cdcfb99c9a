"""Frontend cost of the engine worker process: the raw engine vs the platform, one run.

Stand-in for ``servehall bench compare`` until that lands: it measures, side by side on
the same model and machine,

* ``engine``: the ``openvino_cpu`` engine driven in this process (``S`` requests in flight,
  ``T`` tokens each, EOS ignored) — the denominator;
* ``thread`` / ``process``: ``servehall serve`` with ``isolation = "thread"`` /
  ``"process"``, ``S`` concurrent SSE streams of ``T`` tokens over h2c (httpx), no
  record sink; CPU seconds of the API process (and, for ``process``, of the worker)
  per streamed token from ``/proc``; then sequential one-token requests (latency P50/P99)
  and ``/health/ready`` latency while ``S`` streams run; then five streams of 256 tokens,
  one at a time: SSE events per stream and the gaps between events (smoothness).

Usage: ``.venv/bin/python bench/worker_frontend.py [--model DIR] [--streams 16]
[--tokens 64] [--rounds 3] [--modes engine,thread,process] [--switch-interval S]
[--stream-interval S]`` (the
demo model by default). Prints one JSON object.
Figures from a shared, loaded machine are noisy: compare ratios within one run.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.conftest import demo_config, start_server  # noqa: E402

PROMPT = "ABCDEFGH ABCDEFGH ABC"
LONE_TOKENS = 256
LONE_STREAMS = 5
TICK = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    """utime + stime of ``pid`` in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def children(pid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(entry))
    return out


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


async def raw_engine(model: Path, streams: int, tokens: int, rounds: int) -> dict[str, Any]:
    from servehall import ModelConfig, SamplingParams
    from servehall_openvino_cpu import plugin

    mc = ModelConfig(
        name="demo", path=model, backend="openvino_cpu", options={"inference_precision": "f32"}
    )
    engine = plugin.factory(mc)
    await engine.start()
    from servehall.text import load_tokenizer

    prompt = load_tokenizer(model).encode_plain(PROMPT, add_special_tokens=True)
    params = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True)

    async def one(rid: str) -> int:
        n = 0
        async for d in engine.add_request(rid, prompt, params):
            n += len(d.token_ids)
        return n

    await asyncio.gather(*(one(f"w{i}") for i in range(streams)))
    t0, c0 = time.perf_counter(), time.process_time()
    total = 0
    for r in range(rounds):
        total += sum(await asyncio.gather(*(one(f"r{r}-{i}") for i in range(streams))))
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    await engine.shutdown()
    return {"tokens_per_s": total / wall, "cpu_us_per_token": cpu / total * 1e6}


async def stream_load(client: httpx.AsyncClient, streams: int, tokens: int) -> int:
    body = {
        "model": "demo",
        "prompt": PROMPT,
        "max_tokens": tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }

    async def one() -> int:
        n = 0
        async with client.stream("POST", "/v1/completions", json=body) as r:
            async for line in r.aiter_lines():
                if line.startswith("data: {") and '"usage"' in line:
                    n = json.loads(line[6:])["usage"]["completion_tokens"]
        return n

    return sum(await asyncio.gather(*(one() for _ in range(streams))))


async def platform(
    base_url: str, pid: int, streams: int, tokens: int, rounds: int
) -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=base_url, http1=False, http2=True, timeout=300) as c:
        await stream_load(c, streams, tokens)  # warm-up
        kids = children(pid)
        a0 = cpu_s(pid)
        w0 = sum(cpu_s(k) for k in kids)
        t0 = time.perf_counter()
        total = 0
        for _ in range(rounds):
            total += await stream_load(c, streams, tokens)
        wall = time.perf_counter() - t0
        api_cpu = cpu_s(pid) - a0
        worker_cpu = sum(cpu_s(k) for k in kids) - w0
        lat = []
        for _ in range(100):
            t = time.perf_counter()
            r = await c.post(
                "/v1/completions",
                json={"model": "demo", "prompt": "hello", "max_tokens": 1, "temperature": 0},
            )
            r.raise_for_status()
            lat.append((time.perf_counter() - t) * 1000)
        health: list[float] = []

        async def probe() -> None:
            while True:
                t = time.perf_counter()
                await c.get("/health/ready")
                health.append((time.perf_counter() - t) * 1000)
                await asyncio.sleep(0.02)

        task = asyncio.ensure_future(probe())
        await stream_load(c, streams, tokens)
        task.cancel()
        lone = [await lone_stream(c, LONE_TOKENS) for _ in range(LONE_STREAMS)]
    gaps = sorted(g for _, gs in lone for g in gs)
    return {
        "tokens_per_s": total / wall,
        "api_cpu_us_per_token": api_cpu / total * 1e6,
        "worker_cpu_us_per_token": worker_cpu / total * 1e6 if kids else None,
        "one_token_ms_p50": statistics.median(lat),
        "one_token_ms_p99": pct(lat, 0.99),
        "health_ready_ms_p99": pct(health, 0.99) if health else None,
        "lone_stream_events_mean": statistics.mean(n for n, _ in lone),
        "lone_stream_gap_ms_p50": pct(gaps, 0.5),
        "lone_stream_gap_ms_max": gaps[-1],
    }


async def lone_stream(client: httpx.AsyncClient, tokens: int) -> tuple[int, list[float]]:
    """One stream alone on the server: its number of SSE content events and the gaps
    between them (ms). A smooth stream has about one event per token and gaps near the
    engine's TPOT; tokens held back in the server arrive in bursts (few events, long gaps)."""
    body = {"model": "demo", "prompt": PROMPT, "max_tokens": tokens, "temperature": 0}
    body |= {"stream": True, "ignore_eos": True}
    times: list[float] = []
    async with client.stream("POST", "/v1/completions", json=body) as r:
        async for line in r.aiter_lines():
            if line.startswith("data: {") and '"text"' in line:
                times.append(time.perf_counter())
    return len(times), [(b - a) * 1000 for a, b in itertools.pairwise(times)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", type=Path, default=None)
    ap.add_argument("--streams", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--modes", default="engine,thread,process")
    ap.add_argument(
        "--stream-interval",
        type=float,
        default=None,
        help="[[models]] worker.stream_interval_s of the process mode (default: the default)",
    )
    ap.add_argument(
        "--switch-interval",
        type=float,
        default=None,
        help="[[models]] worker.switch_interval_s of the process mode (default: the default)",
    )
    args = ap.parse_args()
    from servehall.demo import DEFAULT_DEMO_DIR, build_demo_model

    model = args.model or Path(build_demo_model(DEFAULT_DEMO_DIR))
    out: dict[str, Any] = {"streams": args.streams, "tokens": args.tokens, "rounds": args.rounds}
    modes = args.modes.split(",")
    if "engine" in modes:
        out["engine"] = asyncio.run(raw_engine(model, args.streams, args.tokens, args.rounds))
    for isolation in ("thread", "process"):
        if isolation not in modes:
            continue
        cfg = demo_config(model, scheduler={"max_concurrency": args.streams})
        cfg["models"][0]["isolation"] = isolation
        worker: dict[str, float] = {}
        if args.switch_interval is not None:
            worker["switch_interval_s"] = args.switch_interval
        if args.stream_interval is not None:
            worker["stream_interval_s"] = args.stream_interval
        if isolation == "process" and worker:
            cfg["models"][0]["worker"] = worker
        # EOS ignored nowhere on the wire: the demo model's greedy output for PROMPT is long
        srv = start_server(cfg, Path("/tmp") / f"servehall-bench-{os.getpid()}", name=isolation)
        try:
            out[isolation] = asyncio.run(
                platform(srv.base_url, srv.process.pid, args.streams, args.tokens, args.rounds)
            )
        finally:
            srv.stop()
        if "engine" in out:
            out[isolation]["ratio_to_engine"] = (
                out[isolation]["tokens_per_s"] / out["engine"]["tokens_per_s"]
            )
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
