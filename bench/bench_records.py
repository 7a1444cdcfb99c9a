"""Request-log cost per request: the ``sql`` sink on vs off, in one run.

Usage: ``python bench/bench_records.py [--requests N] [--concurrency C] [--pg URL]``

Runs the record part of the request path in-process, on one event loop as the server
does: ``C`` concurrent simulated requests, each awaiting 1 ms of "engine work", then
building its :class:`RequestRecord` (a copy, as the request path emits one) and calling
``bus.emit``. The same load runs for each configuration:

* ``off``: a bus without sinks (``sinks = []``) — the baseline;
* ``sql (SQLite)``: the default ``sql`` sink on a fresh, migrated SQLite file (WAL);
* ``sql (PostgreSQL)``: with ``--pg URL`` (e.g. the test server of .ci/services.d).

For each it prints the wall latency per request (mean and p99, µs), the process CPU time
per request (µs; includes the writer's batched inserts, flushed before the clock stops)
and the differences against the baseline, which are the request-log cost. CPU time is
``time.process_time`` (all threads, so aiosqlite's worker thread counts). The target is
≤ 50 µs of added CPU per request. Not part of the test suite; run it once, on a quiet
machine.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import statistics
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from servehall import RequestRecord
from servehall.config.settings import load_settings
from servehall.db import create_db_engine
from servehall.db.migrate import upgrade_database
from servehall.plugin.manager import PluginHost
from servehall.records.bus import open_record_bus


def make_record(i: int) -> RequestRecord:
    now = datetime.now(UTC)
    return RequestRecord(
        request_id=f"chatcmpl-bench{i:012d}",
        received_at=now,
        finished_at=now,
        principal_id="key-ab12",
        tenant="acme",
        model="demo",
        backend="openvino_cpu",
        endpoint="/v1/chat/completions",
        status_code=200,
        finish_reason="stop",
        prompt_tokens=42,
        completion_tokens=17,
        queue_time_s=0.0004,
        ttft_s=0.021,
        latency_s=0.31,
        stream=True,
        client_addr="10.0.0.7",
        filter_verdicts=[],
    )


async def run_load(settings_data: dict[str, Any], n: int, concurrency: int) -> dict[str, float]:
    """Run ``n`` simulated requests; latency and CPU per request (µs)."""
    bus = await open_record_bus(load_settings(data=settings_data), PluginHost([]))
    await asyncio.sleep(0.2)  # startup audit events written
    latencies: list[float] = []
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(n):
        queue.put_nowait(i)

    async def worker() -> None:
        while True:
            try:
                i = queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            t0 = time.perf_counter()
            await asyncio.sleep(0.001)  # the engine's work
            rec = make_record(i)
            bus.check_admission()
            bus.emit(dataclasses.replace(rec))
            latencies.append(time.perf_counter() - t0)

    cpu0, wall0 = time.process_time(), time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    await bus.close()  # flush everything: the writer's CPU belongs to the cost
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    latencies.sort()
    return {
        "lat_mean_us": statistics.fmean(latencies) * 1e6,
        "lat_p99_us": latencies[int(len(latencies) * 0.99)] * 1e6,
        "cpu_us": cpu / n * 1e6,
        "wall_s": wall,
    }


async def migrate(url: str) -> None:
    engine = create_db_engine(url)
    await upgrade_database(engine)
    await engine.dispose()


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=20_000)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--pg", help="also measure PostgreSQL at this asyncpg URL")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="servehall-bench-"))
    configs: list[tuple[str, dict[str, Any]]] = [("off", {"sinks": []})]
    sqlite_url = f"sqlite+aiosqlite:///{tmp / 'bench.db'}"
    await migrate(sqlite_url)
    spill = {"spill_path": str(tmp / "spill.jsonl")}
    configs.append(
        (
            "sql (SQLite)",
            {"database": {"url": sqlite_url}, "sinks": [{"name": "sql", "options": spill}]},
        )
    )
    if args.pg:
        await migrate(args.pg)
        engine = create_db_engine(args.pg)
        from sqlalchemy import text

        async with engine.begin() as conn:
            await conn.execute(
                text("DELETE FROM request_log WHERE request_id LIKE 'chatcmpl-bench%'")
            )
        await engine.dispose()
        configs.append(
            (
                "sql (PostgreSQL)",
                {"database": {"url": args.pg}, "sinks": [{"name": "sql", "options": spill}]},
            )
        )
    await run_load({"sinks": []}, 2000, args.concurrency)  # warm-up (imports, caches)
    results = []
    for name, data in configs:
        if name == "sql (PostgreSQL)" and args.pg:
            engine = create_db_engine(args.pg)
            from sqlalchemy import text

            async with engine.begin() as conn:
                await conn.execute(
                    text("DELETE FROM request_log WHERE request_id LIKE 'chatcmpl-bench%'")
                )
            await engine.dispose()
        results.append((name, await run_load(data, args.requests, args.concurrency)))
    base = results[0][1]
    print(f"{args.requests} requests, concurrency {args.concurrency}, 1 ms simulated engine work")
    print(
        f"{'config':<18} {'lat mean µs':>12} {'lat p99 µs':>11} {'CPU µs/req':>11} "
        f"{'+lat µs':>8} {'+CPU µs':>8} {'CPU ratio':>9}"
    )
    for name, r in results:
        print(
            f"{name:<18} {r['lat_mean_us']:>12.1f} {r['lat_p99_us']:>11.1f} {r['cpu_us']:>11.1f} "
            f"{r['lat_mean_us'] - base['lat_mean_us']:>8.1f} {r['cpu_us'] - base['cpu_us']:>8.1f} "
            f"{r['cpu_us'] / base['cpu_us']:>9.2f}"
        )
    worst = max(r["cpu_us"] - base["cpu_us"] for _, r in results[1:])
    print(
        f"request-log cost: {worst:.1f} µs CPU per request (target ≤ 50 µs): "
        + ("OK" if worst <= 50 else "OVER TARGET")
    )


if __name__ == "__main__":
    asyncio.run(main())
