"""A replica that stalls inside its audit-chain transaction (a real process stopped with
SIGSTOP while it holds ``audit_chain_head``) cannot stop the other replicas' audit
appends: the server ends the stalled session after ``idle_in_transaction_timeout_s``
and the waiting writer's ``lock_timeout`` turns an endless wait into a retried write."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest

from servehall import AuditEvent
from servehall.db.engine import DbTimeouts
from servehall.db.testing import PgCluster, private_cluster, run_sql
from servehall.records.chain import verify_chain
from servehall.records.sql_sink import SqlSink

TIMEOUTS = DbTimeouts(command_s=20.0, lock_s=1.0, idle_in_transaction_s=2.0)

STALLER = """
import asyncio, sys
from datetime import UTC, datetime
from servehall import AuditEvent
from servehall.db import create_db_engine
from servehall.db.engine import DbTimeouts
from servehall.records.chain import append_events

async def main() -> None:
    engine = create_db_engine(sys.argv[1], timeouts=DbTimeouts(20.0, 1.0, 2.0))
    try:
        async with engine.begin() as conn:
            ev = AuditEvent(actor="a", action="stalled.append", at=datetime.now(UTC))
            await append_events(conn, [ev])
            print("holding", flush=True)
            await asyncio.sleep(float(sys.argv[2]))
        print("committed", flush=True)
    except Exception as exc:
        print("failed", type(exc).__name__, flush=True)

asyncio.run(main())
"""


@pytest.fixture(scope="module")
def cluster() -> Iterator[PgCluster]:
    yield from private_cluster()


async def test_stalled_replica_does_not_block_audit_appends(cluster: PgCluster) -> None:
    staller = subprocess.Popen(
        [sys.executable, "-c", STALLER, cluster.url, "3"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert staller.stdout is not None
        line = await asyncio.to_thread(staller.stdout.readline)
        assert line.strip() == "holding"
        os.kill(staller.pid, signal.SIGSTOP)  # stalls with the chain head locked
        sink = SqlSink(cluster.url, timeouts=TIMEOUTS)
        await sink.start()
        t0 = time.monotonic()
        tries = 0
        try:
            while True:
                tries += 1
                try:
                    ev = AuditEvent(actor="b", action="other.append", at=datetime.now(UTC))
                    await sink.write([ev])
                    break
                except Exception:
                    assert time.monotonic() - t0 < 15, "the stalled replica blocks appends"
                    await asyncio.sleep(0.1)
            waited = time.monotonic() - t0
            assert sink.engine is not None
            assert (await verify_chain(sink.engine)).ok
        finally:
            await sink.close()
        assert waited < 10, waited  # idle_in_transaction 2 s + lock_timeout 1 s + margin
        os.kill(staller.pid, signal.SIGCONT)
        out = await asyncio.to_thread(staller.communicate, timeout=30)
        # the stalled transaction was ended by the server: nothing of it was committed
        assert out[0].strip().startswith("failed"), out
        rows = await run_sql(cluster.url, "SELECT action FROM audit_event ORDER BY id")
        assert [r[0] for r in rows] == ["other.append"]
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(staller.pid, signal.SIGCONT)
            staller.kill()
