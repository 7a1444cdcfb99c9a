"""Offline batches beside online traffic (issue 36's targets and its 1,000-line run).

Usage::

    python bench/bench_batches.py [--size small|demo] [--cap 8] [--online 2]
        [--online-s 20] [--big-lines 5000] [--idle-lines 400] [--accept-lines 1000]
        [--max-tokens 16] [--poll-s 0.25] [--phases online,idle,accept] [--json FILE]

One real ``servehall serve`` (bench/_serve.py) serves the demo model of ``--size``
(``servehall demo-model --size``; built if missing) on openvino_cpu f32, with the auth
plugin (one key made with the real CLI), a SQLite records database with the ``sql``
sink, ``[scheduler] policy = "priority"`` and ``max_concurrency = --cap``, and
``[batches] max_concurrent_lines = --cap`` (raised from the default 4 so a batch can
fill every slot; ``--batch-lines`` sets another) and ``poll_s = --poll-s``. Batches
are made with the ``openai`` SDK
(``files.create``, ``batches.create/retrieve/cancel``, ``files.content``), as in
``tests/test_batches_e2e.py``. Three phases:

1. **online** — ``--online`` closed-loop workers each send streamed chat requests
   (``--online-tokens`` tokens, ignore_eos, greedy) back to back for ``--online-s``
   seconds, timed with ``servehall bench serve``'s client
   (:func:`servehall.bench.client.send_request`): first alone, then while a
   ``--big-lines`` batch runs (the batch is cancelled after the window; how many of its
   lines ran meanwhile is reported). Ratio: online TTFT P99 with ÷ without the batch
   (target ≤ 1.2). ``servehall_slot_seconds_total{class}`` gives the engine-time split.
2. **idle** — no online traffic: ``servehall bench serve``-style throughput (streamed
   requests of the batch lines' shape, :func:`servehall.bench.runner.run_workload`) at
   concurrency ``cap/2``, ``cap`` and ``2·cap``; then a ``--idle-lines`` batch of the
   same requests run to ``completed``; then the best concurrency again (drift check).
   Ratio: batch generated tokens/s (create → ``completed``, and steady state from 10 %
   to 90 % of the lines) ÷ the best online figure (target ≥ 0.9).
3. **accept** — issue 36's "done when": a ``--accept-lines`` chat batch (plain lines,
   forced and auto tool lines, json_schema lines, invalid lines) runs to ``completed``;
   the output and error files hold every ``custom_id`` exactly once; a sample of lines
   sent online by the same key at temperature 0 answers the same
   (``comparable`` from ``tests/test_batches_e2e.py``). Prints PASS/FAIL.

Not part of the test suite. Figures and conditions: docs/performance.md ("Batches").
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import openai

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _serve import Server, serving

from servehall.bench.client import ClientOptions, make_client, send_request
from servehall.bench.metrics import RequestOutput, percentile
from servehall.bench.runner import run_workload
from servehall.bench.workload import BenchRequest
from tests.conftest import dump_toml
from tests.test_batches_e2e import SCHEMA, WEATHER, WORDS, comparable

PEPPER_ENV = "SERVEHALL_BENCH_BATCHES_PEPPER"
SERVEHALL = [str(Path(sys.executable).with_name("servehall"))]
ENDED = ("completed", "failed", "expired", "cancelled")


def now() -> str:
    return time.strftime("%H:%M:%S")


class Bench:
    """The server, its key and the helpers every phase uses."""

    def __init__(self, args: argparse.Namespace, work: Path, model_dir: Path) -> None:
        self.args = args
        self.work = work
        self.model = args.size
        self.env = {PEPPER_ENV: "bench-pepper-" + uuid.uuid4().hex}
        self.cfg: dict[str, Any] = {
            "plugins": {"enabled": ["openvino_cpu", "auth"]},
            "server": {"log_level": "warning"},
            "models": [
                {
                    "name": self.model,
                    "path": str(model_dir),
                    "backend": "auto",
                    "options": {"inference_precision": "f32"},
                }
            ],
            "scheduler": {
                "policy": "priority",
                "max_concurrency": args.cap,
                "max_queue": 4096,
                "queue_timeout_s": 600,
            },
            "database": {"url": f"sqlite+aiosqlite:///{work / 'bench.db'}"},
            "sinks": [{"name": "sql", "options": {"linger_s": 0.05}}],
            "files": {"dir": str(work / "store")},
            "batches": {
                "max_concurrent_lines": args.batch_lines or args.cap,
                "poll_s": args.poll_s,
            },
            "auth": {"pepper": {"env": PEPPER_ENV}, "key_cache_ttl_s": 0},
        }
        self.config = work / "bench.toml"
        self.config.write_text(dump_toml(self.cfg))
        self.key = ""
        self.srv: Server | None = None
        self.counter = 0

    def cli(self, *args: str) -> str:
        proc = subprocess.run(
            [*SERVEHALL, *args, "--config", str(self.config)],
            env={**os.environ, **self.env},
            capture_output=True,
            text=True,
            check=False,
        )
        if proc.returncode:
            raise SystemExit(f"servehall {' '.join(args)} failed:\n{proc.stderr}")
        return proc.stdout

    def make_key(self) -> None:
        self.cli("db", "upgrade")
        self.key = json.loads(self.cli("keys", "create", "--tenant", "bench", "--json"))["key"]

    @property
    def url(self) -> str:
        assert self.srv is not None
        return self.srv.base_url

    def sdk(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url + "/v1", api_key=self.key, max_retries=0)

    def http(self) -> httpx.Client:
        return httpx.Client(
            base_url=self.url,
            http1=False,
            http2=True,
            timeout=600,
            headers={"Authorization": f"Bearer {self.key}"},
        )

    def opts(self) -> ClientOptions:
        return ClientOptions(base_url=self.url, model=self.model, api_key=self.key)

    # --- bodies -------------------------------------------------------------------------

    def chat(self, text: str, **extra: Any) -> dict[str, Any]:
        return {
            "model": self.model,
            "messages": [{"role": "user", "content": text}],
            "temperature": 0,
            "max_tokens": 8,
            **extra,
        }

    def line_prompt(self) -> str:
        """A unique short prompt (no prefix-cache hit between lines)."""
        self.counter += 1
        return f"Tell me about the {WORDS[self.counter % len(WORDS)]} number {self.counter}"

    def throughput_bodies(self, n: int, tag: str) -> dict[str, dict[str, Any]]:
        """``n`` lines of the throughput shape: a short unique prompt, ``--max-tokens``
        tokens out, ignore_eos, greedy."""
        return {
            f"{tag}-{i}": self.chat(
                self.line_prompt(), max_tokens=self.args.max_tokens, ignore_eos=True
            )
            for i in range(n)
        }

    # --- batches ------------------------------------------------------------------------

    def submit(self, bodies: dict[str, dict[str, Any]], name: str) -> tuple[Any, float]:
        """Upload ``bodies`` as a JSONL file and create a chat batch; (batch, perf_counter
        at create)."""
        path = self.work / f"{name}.jsonl"
        path.write_text(
            "".join(
                json.dumps(
                    {"custom_id": c, "method": "POST", "url": "/v1/chat/completions", "body": b}
                )
                + "\n"
                for c, b in bodies.items()
            )
        )
        client = self.sdk()
        with path.open("rb") as fh:
            made = client.files.create(file=fh, purpose="batch")
        t0 = time.perf_counter()
        batch = client.batches.create(
            input_file_id=made.id,
            endpoint="/v1/chat/completions",
            completion_window="24h",
            metadata={"bench": name},
        )
        return batch, t0

    def wait(
        self, batch_id: str, timeout: float, trace: list[tuple[float, int]] | None = None
    ) -> Any:
        """Poll until the batch ends; ``trace`` gets (perf_counter, lines done)."""
        client = self.sdk()
        deadline = time.monotonic() + timeout
        last_print = 0.0
        while True:
            got = client.batches.retrieve(batch_id)
            done = got.request_counts.completed + got.request_counts.failed
            if trace is not None:
                trace.append((time.perf_counter(), done))
            if time.monotonic() - last_print > 15:
                print(f"  {now()} {batch_id} {got.status} {done}/{got.request_counts.total}")
                last_print = time.monotonic()
            if got.status in ENDED:
                return got
            if time.monotonic() > deadline:
                raise SystemExit(f"batch {batch_id} not done in {timeout} s: {got}")
            time.sleep(0.25)

    def lines(self, file_id: str | None) -> list[dict[str, Any]]:
        if file_id is None:
            return []
        text = self.sdk().files.content(file_id).read().decode()
        return [json.loads(x) for x in text.splitlines() if x.strip()]

    def metrics(self) -> dict[str, float]:
        """Slot seconds by class and batch lines finished, summed over labels."""
        with self.http() as c:
            text = c.get("/metrics").text
        out: dict[str, float] = {}
        for m in re.finditer(
            r'^servehall_slot_seconds_total\{[^}]*class="(\w+)"[^}]*\} (\S+)$', text, re.M
        ):
            out[f"slot_s_{m[1]}"] = out.get(f"slot_s_{m[1]}", 0.0) + float(m[2])
        for m in re.finditer(r"^servehall_batch_lines_finished_total\{[^}]*\} (\S+)$", text, re.M):
            out["lines_finished"] = out.get("lines_finished", 0.0) + float(m[1])
        for m in re.finditer(r"^servehall_batch_lines_running(?:\{[^}]*\})? (\S+)$", text, re.M):
            out["lines_running"] = out.get("lines_running", 0.0) + float(m[1])
        return out

    # --- online load --------------------------------------------------------------------

    def online_request(self) -> BenchRequest:
        return BenchRequest(self.line_prompt(), 12, self.args.online_tokens)

    async def online_load(self, seconds: float) -> list[RequestOutput]:
        """``--online`` closed-loop workers sending streamed chats for ``seconds``."""
        opts = self.opts()
        outs: list[RequestOutput] = []
        async with make_client(opts, self.args.online) as client:
            t0 = time.perf_counter()

            async def worker() -> None:
                while time.perf_counter() - t0 < seconds:
                    outs.append(await send_request(client, opts, self.online_request(), t0))

            await asyncio.gather(*(worker() for _ in range(self.args.online)))
        return outs

    async def sweep(self, concurrency: int, n: int) -> dict[str, Any]:
        """``servehall bench serve``-style: ``n`` streamed requests of the batch lines'
        shape at ``concurrency``; output tokens/s and requests/s over the run."""
        opts = self.opts()
        reqs = [BenchRequest(self.line_prompt(), 12, self.args.max_tokens) for _ in range(n)]
        async with make_client(opts, concurrency) as client:

            async def send(req: BenchRequest, t0: float) -> RequestOutput:
                return await send_request(client, opts, req, t0)

            res = await run_workload(reqs, send, max_concurrency=concurrency)
        ok = [o for o in res.outputs if o.success]
        return {
            "concurrency": concurrency,
            "requests": n,
            "failed": n - len(ok),
            "duration_s": res.duration_s,
            "req_s": len(ok) / res.duration_s,
            "out_tok_s": sum(o.output_tokens for o in ok) / res.duration_s,
        }


def ttft_stats(outs: list[RequestOutput]) -> dict[str, Any]:
    ok = [o.ttft for o in outs if o.success]
    if not ok:
        return {"requests": len(outs), "ok": 0}
    return {
        "requests": len(outs),
        "ok": len(ok),
        "ttft_p50_ms": percentile(ok, 50) * 1000,
        "ttft_p90_ms": percentile(ok, 90) * 1000,
        "ttft_p99_ms": percentile(ok, 99) * 1000,
        "ttft_max_ms": max(ok) * 1000,
        "errors": sorted({o.error for o in outs if not o.success})[:3],
    }


# --- phases -----------------------------------------------------------------------------


def phase_online(b: Bench) -> dict[str, Any]:
    a = b.args
    print(f"{now()} online alone: {a.online} workers x {a.online_s} s", flush=True)
    m0 = b.metrics()
    alone = ttft_stats(asyncio.run(b.online_load(a.online_s)))
    m1 = b.metrics()
    print(f"  {alone}", flush=True)
    print(f"{now()} submitting the {a.big_lines}-line batch", flush=True)
    batch, _ = b.submit(b.throughput_bodies(a.big_lines, "big"), "big")
    client = b.sdk()
    deadline = time.monotonic() + 300
    while True:  # wait until the batch fills its slots
        got = client.batches.retrieve(batch.id)
        if got.status == "in_progress" and b.metrics().get("lines_running", 0) >= 1:
            break
        if time.monotonic() > deadline:
            raise SystemExit(f"the big batch did not start: {got}")
        time.sleep(0.2)
    time.sleep(2.0)
    before = client.batches.retrieve(batch.id).request_counts
    m2 = b.metrics()
    print(f"{now()} online with the batch running", flush=True)
    loaded = ttft_stats(asyncio.run(b.online_load(a.online_s)))
    m3 = b.metrics()
    after = client.batches.retrieve(batch.id).request_counts
    print(f"  {loaded}", flush=True)
    still_running = after.completed + after.failed < after.total
    if client.batches.retrieve(batch.id).status in ("validating", "in_progress"):
        client.batches.cancel(batch.id)
    ended = b.wait(batch.id, 300)
    ran_window = (after.completed + after.failed) - (before.completed + before.failed)

    def split(x: dict[str, float], y: dict[str, float]) -> dict[str, float]:
        return {k: y.get(k, 0.0) - x.get(k, 0.0) for k in ("slot_s_online", "slot_s_batch")}

    return {
        "alone": alone,
        "with_batch": loaded,
        "ratio_p99": loaded["ttft_p99_ms"] / alone["ttft_p99_ms"],
        "ratio_p50": loaded["ttft_p50_ms"] / alone["ttft_p50_ms"],
        "batch_lines": a.big_lines,
        "batch_lines_during_window": ran_window,
        "batch_lines_per_s_during_window": ran_window / a.online_s,
        "batch_running_through_window": still_running,
        "batch_end": ended.status,
        "batch_lines_run_total": ended.request_counts.completed + ended.request_counts.failed,
        "slot_seconds_alone": split(m0, m1),
        "slot_seconds_with_batch": split(m2, m3),
    }


def phase_idle(b: Bench) -> dict[str, Any]:
    a = b.args
    sweep = []
    for conc in sorted({max(1, a.cap // 2), a.cap, 2 * a.cap}):
        n = max(2 * conc, a.sweep_requests)
        print(f"{now()} bench-serve-style: concurrency {conc}, {n} requests", flush=True)
        r = asyncio.run(b.sweep(conc, n))
        print(f"  {r}", flush=True)
        sweep.append(r)
    best = max(sweep, key=lambda r: r["out_tok_s"])
    print(f"{now()} idle batch: {a.idle_lines} lines", flush=True)
    bodies = b.throughput_bodies(a.idle_lines, "idle")
    batch, t0 = b.submit(bodies, "idle")
    trace: list[tuple[float, int]] = []
    ended = b.wait(batch.id, 1800, trace)
    t_end = trace[-1][0]
    out = b.lines(ended.output_file_id)
    tokens = sum(x["response"]["body"]["usage"]["completion_tokens"] for x in out)
    total = a.idle_lines

    def first_at(frac: float) -> tuple[float, int]:
        return next((t, d) for t, d in trace if d >= frac * total)

    (ta, da), (tb, db) = first_at(0.1), first_at(0.9)
    steady_lines_s = (db - da) / (tb - ta) if tb > ta else 0.0
    e2e_s = t_end - t0
    batch_res = {
        "lines": total,
        "status": ended.status,
        "completed": ended.request_counts.completed,
        "failed": ended.request_counts.failed,
        "generated_tokens": tokens,
        "e2e_s": e2e_s,
        "lines_s": total / e2e_s,
        "out_tok_s": tokens / e2e_s,
        "steady_lines_s": steady_lines_s,
        "steady_out_tok_s": steady_lines_s * tokens / max(len(out), 1),
    }
    print(f"  {batch_res}", flush=True)
    print(f"{now()} bench-serve-style again at concurrency {best['concurrency']}", flush=True)
    again = asyncio.run(b.sweep(best["concurrency"], best["requests"]))
    print(f"  {again}", flush=True)
    return {
        "sweep": sweep,
        "best": best,
        "best_again": again,
        "batch": batch_res,
        "ratio_e2e": batch_res["out_tok_s"] / best["out_tok_s"],
        "ratio_steady": batch_res["steady_out_tok_s"] / best["out_tok_s"],
        "ratio_steady_vs_again": batch_res["steady_out_tok_s"] / again["out_tok_s"],
    }


def accept_bodies(b: Bench, n: int) -> dict[str, dict[str, Any]]:
    """``n`` chat lines: ~84 % plain, 4 % forced tool, 3 % auto tool, 5 % json_schema,
    4 % invalid (unknown model, negative max_tokens, broken schema, messages not a list)."""
    rng = random.Random(36)
    schema_fmt = {
        "type": "json_schema",
        "json_schema": {"name": "a", "schema": SCHEMA, "strict": True},
    }
    forced = {"type": "function", "function": {"name": "get_weather"}}
    bodies: dict[str, dict[str, Any]] = {}
    for i in range(n):
        r = rng.random()
        w = WORDS[i % len(WORDS)]
        if r < 0.04:
            bodies[f"tool-forced-{i}"] = b.chat(
                f"What is the weather in {w}town?",
                tools=[WEATHER],
                tool_choice=forced,
                max_tokens=48,
            )
        elif r < 0.07:
            bodies[f"tool-auto-{i}"] = b.chat(
                f"Weather in {w}ville {i}?", tools=[WEATHER], tool_choice="auto"
            )
        elif r < 0.12:
            bodies[f"schema-{i}"] = b.chat(
                f"Answer in JSON about {w} {i}", max_tokens=48, response_format=schema_fmt
            )
        elif r < 0.16:
            kind = i % 4
            if kind == 0:
                bodies[f"bad-model-{i}"] = {**b.chat("hi"), "model": "no-such-model"}
            elif kind == 1:
                bodies[f"bad-max-tokens-{i}"] = b.chat("hi", max_tokens=-3)
            elif kind == 2:
                bodies[f"bad-schema-{i}"] = b.chat(
                    "hi",
                    response_format={
                        "type": "json_schema",
                        "json_schema": {"name": "a", "schema": {"type": "nope"}},
                    },
                )
            else:
                bodies[f"bad-messages-{i}"] = {"model": b.model, "messages": "x", "temperature": 0}
        else:
            bodies[f"plain-{i}"] = b.chat(f"Tell me about the {w} {i}", max_tokens=8)
    return bodies


def phase_accept(b: Bench) -> dict[str, Any]:
    a = b.args
    bodies = accept_bodies(b, a.accept_lines)
    kinds: dict[str, int] = {}
    for cid in bodies:
        k = cid.rsplit("-", 1)[0]
        kinds[k] = kinds.get(k, 0) + 1
    print(f"{now()} acceptance batch: {len(bodies)} lines {kinds}", flush=True)
    batch, t0 = b.submit(bodies, "accept")
    ended = b.wait(batch.id, 1800)
    wall = time.perf_counter() - t0
    out = b.lines(ended.output_file_id)
    err = b.lines(ended.error_file_id)
    ids = [x["custom_id"] for x in out + err]
    invalid = {c for c in bodies if c.startswith("bad-")}
    checks: dict[str, bool] = {
        "status completed": ended.status == "completed",
        "every custom_id exactly once": sorted(ids) == sorted(bodies),
        "request_counts match the files": ended.request_counts.total == len(bodies)
        and ended.request_counts.completed == len(out)
        and ended.request_counts.failed == len(err),
        "every invalid line in the error file": invalid <= {x["custom_id"] for x in err},
        "every plain line in the output file": {c for c in bodies if c.startswith("plain-")}
        <= {x["custom_id"] for x in out},
    }
    by_kind: dict[str, dict[str, int]] = {}
    for x in out + err:
        k = x["custom_id"].rsplit("-", 1)[0]
        slot = by_kind.setdefault(k, {"ok": 0, "error": 0})
        slot["ok" if x in out else "error"] += 1
    # a sample sent online by the same key: every kind, then plain lines
    rng = random.Random(7)
    ran = {x["custom_id"]: x for x in out + err if x["response"] is not None}
    sample: list[str] = []
    for k in sorted(by_kind):
        sample += rng.sample(
            sorted(c for c in ran if c.rsplit("-", 1)[0] == k),
            min(a.sample if k == "plain" else 5, sum(1 for c in ran if c.rsplit("-", 1)[0] == k)),
        )
    mismatches = []
    with b.http() as c:
        for cid in sample:
            r = c.post("/v1/chat/completions", json=bodies[cid])
            got = ran[cid]["response"]
            if comparable(got["status_code"], got["body"]) != comparable(r.status_code, r.json()):
                mismatches.append(cid)
    checks[f"{len(sample)} sampled lines equal the online answers"] = not mismatches
    tools_ok = sum(
        1
        for x in out
        if x["custom_id"].startswith("tool-forced")
        and x["response"]["body"]["choices"][0]["message"].get("tool_calls")
    )
    return {
        "lines": len(bodies),
        "kinds": kinds,
        "status": ended.status,
        "wall_s": wall,
        "output_lines": len(out),
        "error_lines": len(err),
        "by_kind": by_kind,
        "forced_tool_lines_with_tool_calls": tools_ok,
        "sample": len(sample),
        "mismatches": mismatches,
        "checks": checks,
        "pass": all(checks.values()),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--size", default="small", help="demo model size (small, demo)")
    ap.add_argument("--cap", type=int, default=8, help="[scheduler] max_concurrency")
    ap.add_argument("--online", type=int, default=2, help="closed-loop online workers")
    ap.add_argument("--online-s", type=float, default=20.0, help="seconds per online window")
    ap.add_argument("--online-tokens", type=int, default=16, help="max_tokens online")
    ap.add_argument("--big-lines", type=int, default=5000)
    ap.add_argument("--idle-lines", type=int, default=400)
    ap.add_argument("--sweep-requests", type=int, default=128)
    ap.add_argument("--accept-lines", type=int, default=1000)
    ap.add_argument("--sample", type=int, default=40, help="plain lines re-sent online")
    ap.add_argument("--max-tokens", type=int, default=16, help="tokens per throughput line")
    ap.add_argument("--poll-s", type=float, default=0.25, help="[batches] poll_s")
    ap.add_argument(
        "--batch-lines",
        type=int,
        default=0,
        help="[batches] max_concurrent_lines (0: --cap)",
    )
    ap.add_argument("--phases", default="online,idle,accept")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()

    from servehall.demo import build_demo_model, default_demo_dir

    model_dir = Path(build_demo_model(default_demo_dir(args.size), size=args.size))
    results: dict[str, Any] = {"params": vars(args) | {"json": str(args.json)}}
    with tempfile.TemporaryDirectory(prefix="servehall-batches-") as tmp:
        b = Bench(args, Path(tmp), model_dir)
        b.make_key()
        print(f"{now()} starting the server ({args.size})", flush=True)
        with serving(b.cfg, env=b.env) as srv:
            b.srv = srv
            asyncio.run(b.online_load(3.0))  # warm-up
            for phase in args.phases.split(","):
                fn = {"online": phase_online, "idle": phase_idle, "accept": phase_accept}[phase]
                results[phase] = fn(b)
                if args.json:
                    args.json.write_text(json.dumps(results, indent=1, default=str))
            results["server_rss_mib"] = srv.rss_bytes() / 2**20
    print(report(results))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1, default=str))
    return 0 if results.get("accept", {}).get("pass", True) else 1


def report(r: dict[str, Any]) -> str:
    p = r["params"]
    lines = [
        f"model {p['size']}, [scheduler] priority, max_concurrency {p['cap']}, "
        f"[batches] max_concurrent_lines {p['batch_lines'] or p['cap']}, poll_s {p['poll_s']}",
    ]
    if "online" in r:
        o = r["online"]
        lines += [
            "",
            f"online: {p['online']} closed-loop streamed chats ({p['online_tokens']} tokens) "
            f"for {p['online_s']} s",
            "| run | requests | TTFT P50 / P90 / P99 ms | slot s online / batch |",
            "|---|---:|---:|---:|",
        ]
        for name, key, sk in (
            ("online alone", "alone", "slot_seconds_alone"),
            (
                f"with a {o['batch_lines']}-line batch running",
                "with_batch",
                "slot_seconds_with_batch",
            ),
        ):
            s, sl = o[key], o[sk]
            lines.append(
                f"| {name} | {s['ok']} | {s['ttft_p50_ms']:.0f} / {s['ttft_p90_ms']:.0f} / "
                f"{s['ttft_p99_ms']:.0f} | {sl['slot_s_online']:.1f} / {sl['slot_s_batch']:.1f} |"
            )
        lines.append(
            f"- TTFT P99 with ÷ without: **{o['ratio_p99']:.2f}** (target ≤ 1.2); P50 "
            f"{o['ratio_p50']:.2f}; batch lines run in the window: "
            f"{o['batch_lines_during_window']} ({o['batch_lines_per_s_during_window']:.1f}/s)"
        )
    if "idle" in r:
        i = r["idle"]
        lines += [
            "",
            "| idle capacity | lines or requests | out tok/s | req or lines/s |",
            "|---|---:|---:|---:|",
        ]
        for s in i["sweep"]:
            lines.append(
                f"| bench-serve-style, concurrency {s['concurrency']} | "
                f"{s['requests']} | {s['out_tok_s']:.0f} | {s['req_s']:.2f} |"
            )
        bb = i["batch"]
        lines.append(
            f"| batch, create → completed | {bb['lines']} | {bb['out_tok_s']:.0f} "
            f"| {bb['lines_s']:.2f} |"
        )
        lines.append(
            f"| batch, steady (10 → 90 % of lines) | | {bb['steady_out_tok_s']:.0f} "
            f"| {bb['steady_lines_s']:.2f} |"
        )
        ag = i["best_again"]
        lines.append(
            f"| bench-serve-style again, concurrency {ag['concurrency']} | "
            f"{ag['requests']} | {ag['out_tok_s']:.0f} | {ag['req_s']:.2f} |"
        )
        lines.append(
            f"- batch ÷ best online: **{i['ratio_steady']:.2f}** steady, "
            f"{i['ratio_e2e']:.2f} create → completed (target ≥ 0.9); steady ÷ the repeat "
            f"{i['ratio_steady_vs_again']:.2f}"
        )
    if "accept" in r:
        a = r["accept"]
        lines += [
            "",
            f"acceptance: {a['lines']} lines {a['kinds']}, {a['status']} in "
            f"{a['wall_s']:.0f} s; output {a['output_lines']}, errors {a['error_lines']}; "
            f"by kind {a['by_kind']}",
        ]
        for name, ok in a["checks"].items():
            lines.append(f"  {'PASS' if ok else 'FAIL'}  {name}")
        lines.append(f"ACCEPTANCE: {'PASS' if a['pass'] else 'FAIL'}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
