"""docs/sql.md: every documented table and column exists, and every example query runs
on both SQLite and PostgreSQL (and returns rows on seeded data); the ``servehall db``
and ``servehall audit`` commands work against a real database."""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import inspect, text

from servehall import AuditEvent, RequestRecord
from servehall.db import create_db_engine
from servehall.db.migrate import upgrade_database
from servehall.db.testing import create_pg_database, drop_pg_database, require_pg
from servehall.records.sql_sink import SqlSink
from tests.conftest import run_cli

DOC = Path(__file__).resolve().parents[1] / "docs" / "sql.md"


def sql_examples() -> list[str]:
    return re.findall(r"```sql\n(.*?)```", DOC.read_text(), flags=re.S)


def documented_columns() -> dict[str, set[str]]:
    """``{table: {columns}}`` from the doc's per-table column tables."""
    out: dict[str, set[str]] = {}
    for m in re.finditer(r"^## `(\w+)`.*?\n(.*?)(?=^## )", DOC.read_text(), flags=re.S | re.M):
        out[m.group(1)] = set(re.findall(r"^\| `(\w+)` \|", m.group(2), flags=re.M))
    return out


@pytest.fixture(params=["sqlite", "postgresql"])
async def seeded(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[str]:
    if request.param == "sqlite":
        url = f"sqlite+aiosqlite:///{tmp_path / 'docs.db'}"
    else:
        url = await create_pg_database(require_pg())
    engine = create_db_engine(url)
    await upgrade_database(engine)
    await engine.dispose()
    sink = SqlSink(url)
    await sink.start()
    t0 = datetime.now(UTC) - timedelta(minutes=5)
    recs = []
    for i in range(20):
        status, code, fin = 200, None, "stop"
        if i % 7 == 3:
            status, code, fin = 503, "queue_full", None
        if i % 9 == 4:
            fin = "client_disconnect"
        recs.append(
            RequestRecord(
                request_id=f"doc-{i}",
                received_at=t0 + timedelta(seconds=i),
                finished_at=t0 + timedelta(seconds=i + 1),
                principal_id="key-ab12",
                tenant=["acme", "beta"][i % 2],
                model="demo",
                backend="cpu",
                endpoint="/v1/chat/completions",
                status_code=status,
                error_code=code,
                finish_reason=fin,
                prompt_tokens=12,
                completion_tokens=8 if status == 200 else 0,
                queue_time_s=0.001,
                ttft_s=0.02 + i / 1000,
                latency_s=0.2 + i / 100,
                stream=bool(i % 2),
                client_addr="127.0.0.1",
            )
        )
    await sink.write(recs)
    await sink.write([AuditEvent(action="key.created", actor="admin", target="key-ab12")])
    await sink.quarantine(RequestRecord(request_id="doc-bad", received_at=t0), "DataError: x")
    await sink.close()
    yield url
    if request.param == "postgresql":
        await drop_pg_database(url)


def test_doc_has_examples_and_tables():
    assert len(sql_examples()) >= 8
    cols = documented_columns()
    assert {"request_log", "audit_event"} <= set(cols)


async def test_every_table_and_column_is_documented(seeded: str):
    engine = create_db_engine(seeded)
    async with engine.connect() as conn:
        actual = await conn.run_sync(
            lambda c: {
                t: {col["name"] for col in inspect(c).get_columns(t)}
                for t in ("request_log", "audit_event", "record_rejected", "batch", "batch_line")
            }
        )
    await engine.dispose()
    documented = documented_columns()
    for table, columns in actual.items():
        assert documented[table] == columns, table


async def test_doc_examples_run(seeded: str):
    engine = create_db_engine(seeded)
    try:
        async with engine.connect() as conn:
            for sql in sql_examples():
                rows = (await conn.execute(text(sql.strip().rstrip(";")))).all()
                assert rows, f"no rows from:\n{sql}"
    finally:
        await engine.dispose()


def cli(*args: str, config: Path) -> subprocess.CompletedProcess[str]:
    return run_cli(config, *args)


def test_cli_db_and_audit_commands(tmp_path: Path):
    db = tmp_path / "cli.db"
    cfg = tmp_path / "deploy.toml"
    cfg.write_text(f'[database]\nurl = "sqlite+aiosqlite:///{db}"\n')
    r = cli("db", "status", config=cfg)  # no database file: exit 2, nothing created
    assert r.returncode == 2 and "servehall db upgrade" in r.stderr, r
    assert not db.exists()
    import sqlite3

    sqlite3.connect(db).close()  # an empty, un-migrated database: exit 1
    r = cli("db", "status", config=cfg)
    assert r.returncode == 1 and "servehall db upgrade" in r.stdout, r
    r = cli("db", "upgrade", config=cfg)
    assert r.returncode == 0, r.stderr
    assert "up to date" in r.stdout

    import asyncio

    async def seed() -> None:
        sink = SqlSink(f"sqlite+aiosqlite:///{db}")
        await sink.start()
        await sink.write(
            [
                RequestRecord(
                    request_id="c1",
                    received_at=datetime.now(UTC),
                    model="demo",
                    endpoint="/v1/completions",
                    status_code=200,
                    latency_s=0.5,
                    ttft_s=0.1,
                    tenant="acme",
                    prompt_tokens=3,
                    completion_tokens=4,
                ),
                *(AuditEvent(action="key.created", target=f"k{i}") for i in range(3)),
            ]
        )
        await sink.close()

    asyncio.run(seed())
    r = cli("audit", "verify", config=cfg)
    assert r.returncode == 0 and "3 audit event(s)" in r.stdout, r.stdout + r.stderr
    today = datetime.now(UTC).date().isoformat()
    r = cli(
        "audit",
        "query",
        "requests_per_tenant_day",
        "--since",
        today,
        "--format",
        "json",
        config=cfg,
    )
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == [
        {
            "day": today,
            "tenant": "acme",
            "requests": 1,
            "ok_requests": 1,
            "error_requests": 0,
            "prompt_tokens": 3,
            "completion_tokens": 4,
            "total_tokens": 7,
        }
    ]
    r = cli("audit", "query", "latency_by_model", "--format", "csv", config=cfg)
    assert r.returncode == 0 and r.stdout.splitlines()[0].startswith("day,model,requests")
    r = cli("audit", "query", "audit_events", "--format", "table", config=cfg)
    assert r.returncode == 0 and "key.created" in r.stdout
    r = cli("audit", "query", "nope", config=cfg)
    assert r.returncode == 2 and "known:" in r.stderr

    import sqlite3

    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE audit_event SET target = 'evil' WHERE id = 2")
    r = cli("audit", "verify", config=cfg)
    assert r.returncode == 1 and "audit_event id 2" in r.stdout


def test_every_sink_runner_option_is_documented():
    from servehall.records.runner import RUNNER_OPTIONS

    doc = DOC.read_text()
    missing = [k for k in RUNNER_OPTIONS if f"`{k}`" not in doc]
    assert not missing, missing
