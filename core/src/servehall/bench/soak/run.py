"""``servehall bench soak``: mixed concurrent traffic, optional faults, then the
invariants I1–I6 (:mod:`servehall.bench.soak.invariants`) checked after a clean stop.

The soak either starts the server itself (``servehall serve --demo`` or ``--config``,
in a work directory of its own, so that it can sample the server's RSS, inject faults
and stop it cleanly before counting rows) or is pointed at a running one (``--url``;
the database checks then need ``--config`` or ``--db-url`` and run without a stop).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

import httpx

from servehall.bench.soak.clients import Traffic, run_clients
from servehall.bench.soak.corpus import sdk_libraries
from servehall.bench.soak.inject import fault_targets, inject_faults
from servehall.bench.soak.invariants import (
    InvariantResult,
    check_api_restarts,
    check_no_5xx,
    check_rss,
)
from servehall.bench.soak.mix import Mix
from servehall.bench.soak.options import SoakError, SoakOptions, check_fault_options
from servehall.bench.soak.readback import record_checks
from servehall.bench.soak.report import json_report, rss_warmup_s, summarize_traffic
from servehall.bench.soak.server import (
    EMBED_MODEL,
    Server,
    frontend_pids,
    rss_bytes,
    start_server,
)

RESTARTS_METRIC = "servehall_api_process_restarts_total"


async def api_restarts(base_url: str, api_key: str | None) -> float | None:
    """``servehall_api_process_restarts_total`` from the server's ``/metrics`` (None
    when it cannot be read)."""
    headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        async with httpx.AsyncClient(timeout=10.0, headers=headers) as c:
            r = await c.get(base_url + "/metrics")
    except httpx.HTTPError:
        return None
    if r.status_code != 200:
        return None
    for line in r.text.splitlines():
        if line.startswith(RESTARTS_METRIC):
            with contextlib.suppress(ValueError, IndexError):
                return float(line.split()[-1])
    return None


async def _read_api_processes(
    server: Server, opts: SoakOptions, traffic: Traffic, wait_s: float = 15.0
) -> None:
    """After the traffic: the frontend processes (waiting up to ``wait_s`` for all
    ``opts.api_processes`` of them, should one killed at the very end still be on its
    way back) and the restarts counted on ``/metrics``, into ``traffic``."""
    deadline = time.monotonic() + wait_s
    while True:
        traffic.api_pids = frontend_pids(server.process.pid)
        if len(traffic.api_pids) >= opts.api_processes or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.2)
    traffic.api_restarts = await api_restarts(server.base_url, opts.api_key)


async def _sample_rss(
    pids: Sequence[int], traffic: Traffic, t0: float, stop: asyncio.Event
) -> None:
    while not stop.is_set():
        traffic.rss.append((time.monotonic() - t0, rss_bytes(pids)))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 1.0)


async def run_soak(opts: SoakOptions, out: TextIO | None = None) -> list[InvariantResult]:
    """Run the soak and check the invariants; the printed report goes to ``out``
    (default: ``sys.stdout`` as it is when the soak runs, so that a redirection made
    after this module was imported, e.g. by a test runner, receives the report)."""
    if out is None:
        out = sys.stdout
    if opts.url is None and not opts.demo and opts.config is None:
        raise SoakError("give --url, --config or --demo")
    check_fault_options(opts)
    workdir = opts.workdir or Path(tempfile.mkdtemp(prefix="servehall-soak-"))
    workdir.mkdir(parents=True, exist_ok=True)
    targets = await fault_targets(opts, workdir, out)
    server: Server | None = None
    if opts.url is None:
        print(f"starting servehall serve in {workdir}", file=out)
        server = await asyncio.to_thread(start_server, opts, workdir)
        base_url = server.base_url
    else:
        base_url = opts.url.rstrip("/").removesuffix("/v1")
    embed = opts.embed_model or (EMBED_MODEL if opts.embed_path is not None else None)
    mix = Mix(opts.model, opts.max_tokens, opts.seed, opts.schemas, embed_model=embed)
    counts = ", ".join(f"{k} {v}" for k, v in mix.counts().items())
    print(
        f"soak {base_url}: {opts.clients} clients, {opts.duration_s:g} s; shapes: {counts}",
        file=out,
    )
    print("recorded client bodies: " + ("; ".join(sdk_libraries()) or "none"), file=out)
    pids = tuple(opts.pids) or ((server.process.pid,) if server is not None else ())
    traffic = Traffic()
    stop = asyncio.Event()
    t0 = time.monotonic()
    sampler = asyncio.create_task(_sample_rss(pids, traffic, t0, stop)) if pids else None
    faults = asyncio.create_task(inject_faults(opts, server, targets, traffic, out))
    try:
        await run_clients(opts, base_url, mix, traffic)
    finally:
        traffic.duration_s = time.monotonic() - t0
        faults.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await faults
        if server is not None and opts.api_processes > 1:
            await _read_api_processes(server, opts, traffic)
        if sampler is not None:
            stop.set()
            await sampler
        if server is not None:
            code = await asyncio.to_thread(server.stop)
            print(f"server stopped (exit {code}) in {server.stop_s:.1f} s", file=out)
    for line in summarize_traffic(traffic):
        print(line, file=out)
    results = [check_no_5xx(traffic.observations, traffic.faults)]
    if opts.faults:
        injected = InvariantResult("F", "declared faults injected", checked=len(traffic.faults))
        injected.violations += traffic.fault_errors
        injected.notes += [f"{w.name}: window {w.end - w.start:.1f} s" for w in traffic.faults]
        results.append(injected)
    if "api-kill" in opts.faults:
        results.append(
            check_api_restarts(
                traffic.faults,
                traffic.observations,
                traffic.api_restarts,
                traffic.api_pids,
                opts.api_processes,
            )
        )
    results += await record_checks(opts, server, traffic)
    results.append(check_rss(traffic.rss, opts.rss_bound_mib, warmup_s=rss_warmup_s(opts)))
    for r in results:
        for line in r.lines():
            print(line, file=out)
    if opts.output_json is not None:
        opts.output_json.write_text(json.dumps(json_report(opts, traffic, results), indent=2))
    if server is not None and any(r.violations for r in results):
        print(f"server log: {server.log_path}", file=out)
    return results
