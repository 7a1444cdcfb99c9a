"""Load-aware routing: P99 TTFT of short requests with one replica loaded, HAProxy with the
servehall agent check ÷ plain round robin, in the same run.

Usage::

    python bench/bench_agent_routing.py [--requests 30] [--cap 2] [--flood-workers 3]
        [--flood-tokens 256] [--json FILE]

Starts two real ``servehall serve`` replicas (the demo model, ``[scheduler]
max_concurrency = CAP``, ``[server] agent_bind``) and two real HAProxy 2.6 processes
running ``deploy/haproxy.cfg`` as is, both in front of the same two replicas:

* **agent**: each server's ``agent-port`` is its replica's agent (the weight follows the
  replica's queue and KV cache, docs/operations.md);
* **round robin**: the agent ports point where nobody listens, so HAProxy keeps the
  configured equal weights (what the file does without agents).

Replica A is loaded by ``--flood-workers`` clients sending long completions
(``--flood-tokens`` tokens, ``ignore_eos``) to A directly, back to back, so its slots
stay full and one more waits. Once A is full (2 s later), short streamed requests
(``"Hi"``, 8 tokens) are sent one at a time, alternating between the two balancers,
``--requests`` through each; TTFT is the time to the first SSE event. Also measured
first: the same short requests with nothing loaded (idle TTFT).

Printed (and written as JSON with ``--json``): P50/P99 TTFT per balancer, the share of
its requests that went to the loaded replica (HAProxy's ``x-servehall-backend`` header),
and agent P99 ÷ round-robin P99 (target ≤ 0.5). With 30 requests a P99 is about the
largest one. Not part of the test suite; one run takes about 1–3 minutes after the two
server starts. Figures and conditions: docs/performance.md.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench._serve import Server, config, serving
from servehall.bench.metrics import percentile
from tests.conftest import free_port, haproxy_binary, run_haproxy

SHORT = {
    "model": "demo",
    "prompt": "Hi",
    "max_tokens": 8,
    "temperature": 0,
    "stream": True,
    "ignore_eos": True,
}


def ttft(client: httpx.Client) -> tuple[float, str]:
    """One short streamed request: (seconds to the first SSE event, replica that answered)."""
    t0 = time.perf_counter()
    with client.stream("POST", "/v1/completions", json=SHORT) as r:
        r.raise_for_status()
        first = None
        for line in r.iter_lines():  # read to the end (the request completes)
            if first is None and line.startswith("data: "):
                first = time.perf_counter() - t0
    if first is None:
        raise RuntimeError("no SSE event")
    return first, r.headers.get("x-servehall-backend", "?")


class Flood:
    """``workers`` threads sending long completions to ``url`` back to back until stopped."""

    def __init__(self, url: str, workers: int, tokens: int) -> None:
        self.body = {
            "model": "demo",
            "prompt": "ABCDEFGH ABCDEFGH ABC",
            "max_tokens": tokens,
            "temperature": 0,
            "ignore_eos": True,
        }
        self.url = url
        self.done = 0
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run) for _ in range(workers)]

    def _run(self) -> None:
        with httpx.Client(base_url=self.url, timeout=600) as c:
            while not self._stop.is_set():
                c.post("/v1/completions", json=self.body).raise_for_status()
                self.done += 1

    def __enter__(self) -> Flood:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(600)


def gauge(srv: Server, name: str) -> float:
    """A label-less gauge of ``srv``'s ``/metrics``."""
    for line in httpx.get(srv.base_url + "/metrics", timeout=30).text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise KeyError(name)


def summary(samples: list[tuple[float, str]]) -> dict[str, Any]:
    """P50/P99 TTFT (s) and the share of requests answered by replica ``a``."""
    times = [t for t, _ in samples]
    return {
        "n": len(times),
        "ttft_p50_s": round(percentile(times, 50), 4),
        "ttft_p99_s": round(percentile(times, 99), 4),
        "share_to_loaded": round(sum(1 for _, who in samples if who == "a") / len(samples), 3),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=30, help="short requests per balancer")
    ap.add_argument("--cap", type=int, default=2, help="[scheduler] max_concurrency")
    ap.add_argument("--flood-workers", type=int, default=3)
    ap.add_argument("--flood-tokens", type=int, default=256)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    binary = haproxy_binary()
    if binary is None:
        sys.exit("haproxy not installed (.ci/services.d/haproxy.sh)")
    load_start = os.getloadavg()
    logs = Path(tempfile.mkdtemp(prefix="bench-agent-"))
    with ExitStack() as stack:
        replicas: dict[str, Server] = {}
        agents: dict[str, int] = {}
        for name in ("a", "b"):
            agents[name] = free_port()
            cfg = config(
                server={"agent_bind": f"127.0.0.1:{agents[name]}"},
                scheduler={"max_concurrency": args.cap},
            )
            replicas[name] = stack.enter_context(serving(cfg))
        a, b = (f"127.0.0.1:{replicas[n].port}" for n in ("a", "b"))
        balancers = {
            "agent": stack.enter_context(
                run_haproxy(binary, a, b, agents["a"], agents["b"], logs / "agent.log")
            ),
            "round_robin": stack.enter_context(
                run_haproxy(binary, a, b, free_port(), free_port(), logs / "rr.log")
            ),
        }
        clients = {
            k: stack.enter_context(httpx.Client(base_url=u, timeout=600))
            for k, u in balancers.items()
        }
        time.sleep(2.5)  # both HAProxies have read the agents (agent-inter 1 s)
        idle = [ttft(clients["round_robin"]) for _ in range(10)]
        samples: dict[str, list[tuple[float, str]]] = {k: [] for k in clients}
        with Flood(replicas["a"].base_url, args.flood_workers, args.flood_tokens) as flood:
            deadline = time.monotonic() + 120
            while gauge(replicas["a"], "servehall_replica_requests_running") < args.cap:
                if time.monotonic() > deadline:
                    sys.exit("replica A never filled its slots")
                time.sleep(0.05)
            time.sleep(2.0)
            for i in range(args.requests):
                order = ("agent", "round_robin") if i % 2 == 0 else ("round_robin", "agent")
                for k in order:
                    samples[k].append(ttft(clients[k]))
            flood_done = flood.done
    result = {
        "requests_per_balancer": args.requests,
        "cap": args.cap,
        "flood_workers": args.flood_workers,
        "flood_tokens": args.flood_tokens,
        "flood_requests_completed": flood_done,
        "idle": summary(idle),
        "agent": summary(samples["agent"]),
        "round_robin": summary(samples["round_robin"]),
        "loadavg_start": [round(x, 2) for x in load_start],
        "loadavg_end": [round(x, 2) for x in os.getloadavg()],
        "cpus": os.cpu_count(),
    }
    rr = result["round_robin"]["ttft_p99_s"]
    result["p99_agent_over_round_robin"] = round(result["agent"]["ttft_p99_s"] / rr, 4)
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
