"""A real PostgreSQL outage under the record bus: a private cluster (initdb) is stopped
while records flow and started again; nothing is lost, and a required sink fails closed
when its buffer is exhausted."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from sqlalchemy import text

from servehall import RequestRecord, ServiceUnavailableError
from servehall.config.settings import load_settings
from servehall.db import create_db_engine
from servehall.db.migrate import upgrade_database
from servehall.db.testing import PgCluster, pg_bin_dir, require_pg
from servehall.plugin.manager import PluginHost
from servehall.records.bus import open_record_bus


@pytest.fixture(scope="module")
def cluster() -> Iterator[PgCluster]:
    require_pg()  # same policy as the shared server: fail in CI, skip elsewhere
    if pg_bin_dir() is None:
        pytest.skip("PostgreSQL server binaries not installed")
    c = PgCluster().init()
    c.start()
    yield c
    c.destroy()


async def _count(url: str) -> int:
    engine = create_db_engine(url)
    try:
        async with engine.connect() as conn:
            return int((await conn.execute(text("SELECT count(*) FROM request_log"))).scalar_one())
    finally:
        await engine.dispose()


async def _reset(url: str) -> None:
    engine = create_db_engine(url)
    await upgrade_database(engine)
    async with engine.begin() as conn:
        await conn.execute(text("DELETE FROM request_log"))
    await engine.dispose()


def _rec(i: int) -> RequestRecord:
    return RequestRecord(
        request_id=f"o-{i}",
        received_at=datetime.now(UTC),
        endpoint="/v1/completions",
        status_code=200,
        model="demo",
    )


async def test_outage_loses_nothing(cluster: PgCluster, tmp_path: Path):
    await _reset(cluster.url)
    opts = {
        "buffer": 50,
        "batch_size": 20,
        "retry_initial_s": 0.05,
        "retry_max_s": 0.3,
        "spill_path": str(tmp_path / "spill.jsonl"),
        "linger_s": 0.005,
    }
    settings = load_settings(
        data={"database": {"url": cluster.url}, "sinks": [{"name": "sql", "options": opts}]}
    )
    bus = await open_record_bus(settings, PluginHost([]))
    sent = 0
    stopper = asyncio.create_task(asyncio.sleep(0))
    for i in range(400):
        if i == 100:
            stopper = asyncio.create_task(asyncio.to_thread(cluster.stop, "fast"))
        if i == 300:
            await stopper
            await asyncio.to_thread(cluster.start)
        bus.check_admission()
        bus.emit(_rec(i))
        sent += 1
        await asyncio.sleep(0.002)
    await stopper
    runner = bus.runners[0]
    loop = asyncio.get_running_loop()
    end = loop.time() + 30
    while (runner.pending or runner.stats()["spilled_bytes"]) and loop.time() < end:
        await asyncio.sleep(0.05)
    assert runner.failures > 0, "the outage was not noticed"
    await bus.close()
    assert await _count(cluster.url) == sent


async def test_required_sink_503s_when_exhausted_and_records_every_answer(
    cluster: PgCluster, tmp_path: Path
):
    await _reset(cluster.url)
    opts = {"buffer": 30, "spill": False, "retry_initial_s": 0.05, "retry_max_s": 0.3}
    settings = load_settings(
        data={
            "database": {"url": cluster.url},
            "sinks": [{"name": "sql", "required": True, "options": opts}],
        }
    )
    bus = await open_record_bus(settings, PluginHost([]))
    loop = asyncio.get_running_loop()
    end = loop.time() + 30
    while bus.runners[0].pending and loop.time() < end:  # the startup audit events are written
        await asyncio.sleep(0.02)
    assert not bus.runners[0].pending
    await asyncio.to_thread(cluster.stop, "immediate")
    admitted = refused = 0
    for i in range(100):
        try:
            bus.check_admission()
        except ServiceUnavailableError as exc:
            assert exc.headers.get("Retry-After")
            refused += 1
            continue
        admitted += 1
        bus.emit(_rec(i))
        await asyncio.sleep(0.001)
    assert admitted == 30 and refused == 70
    await asyncio.to_thread(cluster.start)
    runner = bus.runners[0]
    end = loop.time() + 30
    while runner.pending and loop.time() < end:
        await asyncio.sleep(0.05)
    bus.check_admission()  # admits again once the backlog is written
    await bus.close()
    assert await _count(cluster.url) == admitted
