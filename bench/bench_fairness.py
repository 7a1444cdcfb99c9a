"""Fair multi-tenant scheduling: tenant B's TTFT while tenant A floods, ``fcfs`` vs ``fair``.

Usage::

    python bench/bench_fairness.py [--model-dir DIR] [--cap 4] [--duration 12]
        [--prompt-tokens 1500] [--out-tokens 256] [--b-interval 1]
        [--burst-slots N] [--max-num-batched-tokens T] [--inference-threads N]
        [--json FILE]

Starts real ``servehall serve`` subprocesses (the auth plugin on, one SQLite key store,
three tenants' keys made with the real CLI) serving the demo model (built into a temp
directory unless ``--model-dir`` is given) with ``[scheduler] max_concurrency = CAP``,
and measures, over HTTP/2:

1. **idle**: B alone, short streamed chat requests (``"Hi"``, 16 tokens out) every
   ``--b-interval`` seconds: B's idle TTFT (P50/P99).
2. **loaded**, once per policy (``fcfs``, then ``fair``): A keeps ``4 × CAP`` long
   completions in flight (``--prompt-tokens`` prompt tokens, ``--out-tokens`` out, each
   prompt made unique so no prefix cache helps) while B sends the same short requests at
   the same rate. Reports B's TTFT P50/P99 and the total token throughput (prompt +
   generated tokens per second, both tenants, from ``servehall_scheduler_service_tokens_total``).
3. **service gap**, once per policy: tenants A and C both flood the same long requests;
   ``servehall_scheduler_service_tokens_total{tenant}`` is scraped every 100 ms, and the
   largest difference in service received since both became backlogged is compared with
   the VTC bound ``2 × (prompt_tokens + max_tokens)`` of one request.

Printed (and written as JSON with ``--json``): the ratios B P99 TTFT fair ÷ fcfs (target
≤ 0.2), B loaded ÷ idle under fair (target ≤ 3), throughput fair ÷ fcfs (target ≥ 0.95)
and the measured gap ÷ bound; B's queue wait (``queue_time_s`` from the servers'
``jsonl`` request log) is shown beside its TTFT, the scheduler's share of it. Not part of
the test suite; one run takes about ``5 × duration`` seconds plus two server starts.
Figures and conditions: docs/performance.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from servehall.testing.sockets import free_port

PEPPER_ENV = "SERVEHALL_BENCH_PEPPER"
SERVEHALL = [str(Path(sys.executable).with_name("servehall"))]  # the venv's console script


def p(values: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``values`` (nearest rank), 0 when empty."""
    if not values:
        return 0.0
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q * len(s) + 0.5) - 1))]


def toml(cfg: dict[str, Any]) -> str:
    """Enough TOML for this config: tables of scalars/lists/inline tables, table arrays."""

    def val(v: Any) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, int | float):
            return repr(v)
        if isinstance(v, str):
            return json.dumps(v)
        if isinstance(v, list):
            return "[" + ", ".join(val(x) for x in v) + "]"
        return "{" + ", ".join(f"{json.dumps(k)} = {val(x)}" for k, x in v.items()) + "}"

    out = []
    for name, section in cfg.items():
        items = section if isinstance(section, list) else [section]
        for item in items:
            out.append(f"[[{name}]]" if isinstance(section, list) else f"[{name}]")
            out += [f"{k} = {val(v)}" for k, v in item.items()]
    return "\n".join(out) + "\n"


class Bench:
    def __init__(self, args: argparse.Namespace, work: Path, model_dir: Path) -> None:
        self.args = args
        self.work = work
        self.model_dir = model_dir
        self.env = {**os.environ, PEPPER_ENV: "bench-pepper-" + uuid.uuid4().hex}
        self.keys: dict[str, str] = {}
        self.counter = itertools.count()
        self.long_prompt = ""
        self.prompt_tokens = args.prompt_tokens  # measured by calibrate()

    def config(self, policy: str) -> Path:
        options: dict[str, Any] = {"inference_precision": "f32"}
        if self.args.max_num_batched_tokens:
            options["max_num_batched_tokens"] = self.args.max_num_batched_tokens
        if self.args.inference_threads:
            options["inference_num_threads"] = self.args.inference_threads
        if self.args.arrival_order_prefill:
            options["shortest_prefill_first"] = False
        scheduler: dict[str, Any] = {
            "policy": policy,
            "max_concurrency": self.args.cap,
            "max_queue": 1024,
            "queue_timeout_s": 600,
        }
        if policy == "fair" and self.args.burst_slots:
            scheduler["burst_slots"] = self.args.burst_slots
        cfg = {
            "plugins": {"enabled": ["openvino_cpu", "auth"]},
            "server": {"log_level": "warning"},
            "models": [
                {
                    "name": "demo",
                    "path": str(self.model_dir),
                    "backend": "auto",
                    "options": options,
                }
            ],
            "scheduler": scheduler,
            "database": {"url": f"sqlite+aiosqlite:///{self.work / 'bench.db'}"},
            "sinks": [{"name": "jsonl", "options": {"path": str(self.records(policy))}}],
            "auth": {"pepper": {"env": PEPPER_ENV}},
        }
        path = self.work / f"{policy}.toml"
        path.write_text(toml(cfg))
        return path

    def records(self, policy: str) -> Path:
        """The server's request log (``jsonl`` sink): one JSON object per request."""
        return self.work / f"{policy}-requests.jsonl"

    def b_queue_times(self, policy: str, since: float) -> list[float]:
        """``queue_time_s`` of tenant B's requests received after ``since`` (Unix s)."""
        out = []
        for line in self.records(policy).read_text().splitlines():
            rec = json.loads(line)
            if rec.get("tenant") == "tenant-b" and rec.get("queue_time_s") is not None:
                received = rec.get("received_at", "")
                if received and _unix(received) >= since:
                    out.append(float(rec["queue_time_s"]))
        return out

    def cli(self, config: Path, *args: str) -> str:
        proc = subprocess.run(
            [*SERVEHALL, *args, "--config", str(config)],
            env=self.env,
            capture_output=True,
            text=True,
            check=False,
        )
        if proc.returncode:
            raise SystemExit(f"servehall {' '.join(args)} failed:\n{proc.stderr}")
        return proc.stdout

    def make_keys(self) -> None:
        config = self.config("fcfs")
        self.cli(config, "db", "upgrade")
        for tenant in ("a", "b", "c"):
            out = self.cli(config, "keys", "create", "--tenant", f"tenant-{tenant}", "--json")
            self.keys[tenant] = json.loads(out)["key"]

    @contextlib.contextmanager
    def server(self, policy: str) -> Iterator[str]:
        port = free_port()
        log = (self.work / f"{policy}.log").open("wb")
        proc = subprocess.Popen(
            [
                *SERVEHALL,
                "serve",
                "--config",
                str(self.config(policy)),
                "--bind",
                f"127.0.0.1:{port}",
            ],
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 900
            while True:
                if proc.poll() is not None:
                    raise SystemExit(f"server exited; see {log.name}")
                with contextlib.suppress(httpx.HTTPError):
                    if httpx.get(url + "/health/ready", timeout=2).status_code == 200:
                        break
                if time.monotonic() > deadline:
                    raise SystemExit(f"server not ready in 900 s; see {log.name}")
                time.sleep(0.2)
            yield url
        finally:
            proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(30)
            if proc.poll() is None:
                proc.kill()
            log.close()

    def h(self, tenant: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.keys[tenant]}"}

    # --- workloads ---------------------------------------------------------------------

    async def calibrate(self, c: httpx.AsyncClient) -> None:
        """Find a prompt of about ``--prompt-tokens`` tokens (the demo tokenizer's)."""

        async def tokens(words: int) -> int:
            r = await c.post(
                "/v1/completions",
                json={"model": "demo", "prompt": text(words), "max_tokens": 1},
                headers=self.h("a"),
            )
            r.raise_for_status()
            return int(r.json()["usage"]["prompt_tokens"])

        def text(words: int) -> str:
            return " ".join(f"w{i % 97}" for i in range(words))

        per_word = await tokens(100) / 100
        words = int(self.args.prompt_tokens / per_word)
        got = await tokens(words)
        words = int(words * self.args.prompt_tokens / got)
        self.long_prompt = text(words)
        self.prompt_tokens = await tokens(words)

    async def long_request(self, c: httpx.AsyncClient, tenant: str) -> int:
        prompt = f"{next(self.counter)} {self.long_prompt}"  # unique: no prefix cache hit
        r = await c.post(
            "/v1/completions",
            json={
                "model": "demo",
                "prompt": prompt,
                "max_tokens": self.args.out_tokens,
                "temperature": 0,
            },
            headers=self.h(tenant),
        )
        r.raise_for_status()
        return int(r.json()["usage"]["completion_tokens"])

    async def flood(
        self, c: httpx.AsyncClient, tenant: str, stop: asyncio.Event, out: list[tuple[float, int]]
    ) -> None:
        """Keep ``4 × cap`` long requests of ``tenant`` in flight until ``stop``."""

        async def worker() -> None:
            while not stop.is_set():
                tokens = await self.long_request(c, tenant)
                out.append((time.monotonic(), tokens))

        await asyncio.gather(*(worker() for _ in range(4 * self.args.cap)))

    async def short_request(self, c: httpx.AsyncClient) -> tuple[float, int]:
        start = time.monotonic()
        ttft: float | None = None
        tokens = 0
        body = {
            "model": "demo",
            "messages": [{"role": "user", "content": "Hi"}],
            "max_tokens": 16,
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        async with c.stream("POST", "/v1/chat/completions", json=body, headers=self.h("b")) as r:
            r.raise_for_status()
            async for line in r.aiter_lines():
                if not line.startswith("data: {"):
                    continue
                chunk = json.loads(line[6:])
                if (
                    ttft is None
                    and chunk["choices"]
                    and chunk["choices"][0]["delta"].get("content")
                ):
                    ttft = time.monotonic() - start
                if chunk.get("usage"):
                    tokens = chunk["usage"]["completion_tokens"]
        return (ttft if ttft is not None else time.monotonic() - start), tokens

    async def steady_b(
        self, c: httpx.AsyncClient, duration: float, out: list[tuple[float, int]]
    ) -> None:
        tasks = []
        t0 = time.monotonic()
        while time.monotonic() - t0 < duration:
            tasks.append(asyncio.ensure_future(self.short_request(c)))
            await asyncio.sleep(self.args.b_interval)
        out.extend(await asyncio.gather(*tasks))

    def client(self, url: str) -> httpx.AsyncClient:
        limits = httpx.Limits(max_connections=200, max_keepalive_connections=200)
        return httpx.AsyncClient(base_url=url, http2=True, timeout=600, limits=limits)

    async def idle(self, url: str) -> dict[str, Any]:
        async with self.client(url) as c:
            await self.calibrate(c)
            for _ in range(3):
                await self.short_request(c)  # warm-up
            b: list[tuple[float, int]] = []
            await self.steady_b(c, self.args.duration / 2, b)
        ttfts = [t for t, _ in b]
        return {
            "b_requests": len(b),
            "b_ttft_p50_s": p(ttfts, 0.5),
            "b_ttft_p90_s": p(ttfts, 0.9),
            "b_ttft_p99_s": p(ttfts, 0.99),
            "b_ttft_s": sorted(ttfts),
        }

    async def loaded(self, url: str, policy: str) -> dict[str, Any]:
        wall0 = time.time()
        async with self.client(url) as c:
            if not self.long_prompt:
                await self.calibrate(c)
            stop = asyncio.Event()
            a: list[tuple[float, int]] = []
            flood = asyncio.ensure_future(self.flood(c, "a", stop, a))
            await asyncio.sleep(self.args.duration / 4)  # let A's backlog build
            b: list[tuple[float, int]] = []
            g0, t0 = await self.generated(c), time.monotonic()
            await self.steady_b(c, self.args.duration, b)
            g1, t1 = await self.generated(c), time.monotonic()
            stop.set()
            await flood
        ttfts = [t for t, _ in b]
        await asyncio.sleep(1.0)  # the sink writes each record when its request ends
        queue = self.b_queue_times(policy, wall0)
        return {
            "b_requests": len(b),
            "b_ttft_p50_s": p(ttfts, 0.5),
            "b_ttft_p90_s": p(ttfts, 0.9),
            "b_ttft_p99_s": p(ttfts, 0.99),
            "b_ttft_s": sorted(ttfts),
            "b_queue_p50_s": p(queue, 0.5),
            "b_queue_p99_s": p(queue, 0.99),
            "a_requests_done": sum(1 for t, _ in a if t0 <= t <= t1),
            "throughput_tok_s": (g1 - g0) / (t1 - t0),
        }

    async def generated(self, c: httpx.AsyncClient) -> float:
        """Tokens served so far, all tenants: the sum of
        ``servehall_scheduler_service_tokens_total`` (prompt tokens of admitted requests
        plus generated tokens, running requests included; the throughput's numerator)."""
        r = await c.get("/metrics", headers=self.h("b"))
        pattern = r'^servehall_scheduler_service_tokens_total\{model="demo",[^}]*\} (\S+)$'
        return sum(float(v) for v in re.findall(pattern, r.text, re.M))

    async def gap(self, url: str) -> dict[str, Any]:
        """Largest service difference between two backlogged tenants (A and C)."""
        pattern = re.compile(
            r'^servehall_scheduler_(queue|service_tokens_total)\{model="demo",'
            r'tenant="tenant-(\w)"\} (\S+)$',
            re.M,
        )

        async def scrape(c: httpx.AsyncClient) -> dict[tuple[str, str], float]:
            r = await c.get("/metrics", headers=self.h("b"))
            return {(m[0], m[1]): float(m[2]) for m in pattern.findall(r.text)}

        async with self.client(url) as c:
            if not self.long_prompt:
                await self.calibrate(c)
            stop = asyncio.Event()
            sink: list[tuple[float, int]] = []
            floods = [asyncio.ensure_future(self.flood(c, t, stop, sink)) for t in "ac"]
            base: dict[tuple[str, str], float] | None = None
            worst = 0.0
            samples = 0
            t0 = time.monotonic()
            while time.monotonic() - t0 < self.args.duration:
                m = await scrape(c)
                both = m.get(("queue", "a"), 0) > 0 and m.get(("queue", "c"), 0) > 0
                if both and base is None:
                    base = m
                elif both and base is not None:
                    sa = m[("service_tokens_total", "a")] - base[("service_tokens_total", "a")]
                    sc = m[("service_tokens_total", "c")] - base[("service_tokens_total", "c")]
                    worst = max(worst, abs(sa - sc))
                    samples += 1
                await asyncio.sleep(0.1)
            stop.set()
            await asyncio.gather(*floods)
        bound = 2 * (self.prompt_tokens + 4 + self.args.out_tokens)  # +4: the unique prefix
        return {"max_gap_tokens": worst, "vtc_bound_tokens": bound, "samples": samples}


async def run(args: argparse.Namespace, bench: Bench) -> dict[str, Any]:
    results: dict[str, Any] = {"params": vars(args) | {"model_dir": str(bench.model_dir)}}
    for policy in ("fcfs", "fair"):
        with bench.server(policy) as url:
            if policy == "fcfs":
                results["idle"] = await bench.idle(url)
                print("idle", results["idle"], flush=True)
            results[policy] = await bench.loaded(url, policy)
            print(policy, results[policy], flush=True)
            results[f"{policy}_gap"] = await bench.gap(url)
            print(f"{policy} gap", results[f"{policy}_gap"], flush=True)
    fcfs, fair, idle = results["fcfs"], results["fair"], results["idle"]
    results["ratios"] = {
        "b_p99_ttft_fair_over_fcfs": fair["b_ttft_p99_s"] / fcfs["b_ttft_p99_s"],
        "b_p99_ttft_fair_loaded_over_idle": fair["b_ttft_p99_s"] / idle["b_ttft_p99_s"],
        "throughput_fair_over_fcfs": fair["throughput_tok_s"] / fcfs["throughput_tok_s"],
        "fair_gap_over_bound": results["fair_gap"]["max_gap_tokens"]
        / results["fair_gap"]["vtc_bound_tokens"],
        "fcfs_gap_over_bound": results["fcfs_gap"]["max_gap_tokens"]
        / results["fcfs_gap"]["vtc_bound_tokens"],
    }
    return results


def report(r: dict[str, Any]) -> str:
    ms = 1000.0
    lines = [
        "| run | B TTFT P50 / P90 / P99 (ms) | B queue wait P50 / P99 (ms) "
        "| throughput, prompt + generated (tok/s) |",
        "|---|---:|---:|---:|",
    ]
    for name, key in (
        ("B idle", "idle"),
        ("B under A's flood, fcfs", "fcfs"),
        ("B under A's flood, fair", "fair"),
    ):
        row = r[key]
        ttft = " / ".join(
            f"{row.get(f'b_ttft_{q}_s', float('nan')) * ms:.0f}" for q in ("p50", "p90", "p99")
        )
        q = (
            f"{row['b_queue_p50_s'] * ms:.0f} / {row['b_queue_p99_s'] * ms:.0f}"
            if "b_queue_p50_s" in row
            else ""
        )
        tp = f"{row['throughput_tok_s']:.0f}" if "throughput_tok_s" in row else ""
        lines.append(f"| {name} | {ttft} | {q} | {tp} |")
    x = r["ratios"]
    lines += [
        "",
        f"- B P99 TTFT fair ÷ fcfs: **{x['b_p99_ttft_fair_over_fcfs']:.2f}** (target ≤ 0.2)",
        f"- B P99 TTFT loaded (fair) ÷ idle: **{x['b_p99_ttft_fair_loaded_over_idle']:.1f}** "
        "(target ≤ 3)",
        f"- total throughput fair ÷ fcfs: **{x['throughput_fair_over_fcfs']:.2f}** (target ≥ 0.95)",
        f"- service gap between two backlogged tenants: fair "
        f"{r['fair_gap']['max_gap_tokens']:.0f} tokens = **{x['fair_gap_over_bound']:.2f}** × "
        f"the VTC bound ({r['fair_gap']['vtc_bound_tokens']} tokens); fcfs "
        f"{r['fcfs_gap']['max_gap_tokens']:.0f} tokens = {x['fcfs_gap_over_bound']:.2f} × bound",
    ]
    return "\n".join(lines)


def _unix(iso: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model-dir", type=Path, default=None)
    ap.add_argument("--cap", type=int, default=4, help="[scheduler] max_concurrency")
    ap.add_argument("--duration", type=float, default=15.0, help="seconds per loaded phase")
    ap.add_argument("--prompt-tokens", type=int, default=1500)
    ap.add_argument("--out-tokens", type=int, default=256)
    ap.add_argument("--b-interval", type=float, default=1.0, help="seconds between B's requests")
    ap.add_argument(
        "--burst-slots",
        type=int,
        default=0,
        help="[scheduler] burst_slots of the fair phase (0: not set)",
    )
    ap.add_argument(
        "--max-num-batched-tokens",
        type=int,
        default=0,
        help="openvino_cpu options.max_num_batched_tokens, both phases (0: the default)",
    )
    ap.add_argument(
        "--inference-threads",
        type=int,
        default=0,
        help="openvino_cpu options.inference_num_threads, every phase (0: OpenVINO's default)",
    )
    ap.add_argument(
        "--arrival-order-prefill",
        action="store_true",
        help="openvino_cpu options.shortest_prefill_first = false, every phase",
    )
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="servehall-fair-") as tmp:
        work = Path(tmp)
        model_dir = args.model_dir
        if model_dir is None:
            from servehall.demo import build_demo_model

            model_dir = build_demo_model(work / "demo-model")
        bench = Bench(args, work, model_dir)
        bench.make_keys()
        results = asyncio.run(run(args, bench))
    print(report(results))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2, default=str))


if __name__ == "__main__":
    main()
