"""Records that cannot be wedged, through the real server (issue 33, item 1; Hypercorn,
HTTP/2, the demo model, a ``required`` sql sink) on SQLite and PostgreSQL:

* one request with ``tools`` (``tool_choice: "auto"``, a text answer: ``tool_calls =
  []``, the row that used to wedge the log) followed by 100 plain ones leaves 101 rows;
* with the database refusing the ``tools`` request's row (a test trigger,
  :func:`servehall.db.testing.reject_rows`), the same traffic leaves 100 rows plus one
  quarantined record, named in the log with its request id, counted in
  ``servehall_records_rejected_total``, listed by ``servehall db status``; the replica
  stays ready;
* restarting replays nothing twice: no spill file, no new row, no new quarantined record.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from servehall.db.testing import (
    REJECT_MESSAGE,
    create_pg_database,
    drop_pg_database,
    reject_rows,
    require_pg,
    run_sql,
)
from servehall.testing.cli import servehall_cmd
from tests.conftest import run_cli, start_server

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}


def query(url: str, sql: str) -> list[Any]:
    return asyncio.run(run_sql(url, sql))


def count(url: str, table: str) -> int:
    return int(query(url, f"SELECT count(*) FROM {table}")[0][0])


def wait_count(url: str, table: str, n: int, timeout: float = 30.0) -> int:
    end = time.monotonic() + timeout
    got = -1
    while time.monotonic() < end:
        got = count(url, table)
        if got >= n:
            return got
        time.sleep(0.1)
    return got


def chat(content: str, **extra: Any) -> dict[str, Any]:
    return {
        "model": "demo",
        "temperature": 0,
        "max_tokens": 2,
        "messages": [{"role": "user", "content": content}],
        **extra,
    }


async def _traffic(base_url: str) -> tuple[str, list[str]]:
    """One ``tools`` request (auto), then 100 plain ones (10 at a time over HTTP/2): the
    ``tools`` request's id and the plain ones'."""
    async with httpx.AsyncClient(base_url=base_url, http2=True, timeout=120) as c:
        r = await c.post(
            "/v1/chat/completions",
            json=chat("What is the weather in Paris?", tools=[WEATHER], tool_choice="auto"),
        )
        assert r.status_code == 200, r.text
        tools_id = r.headers["x-request-id"]
        ids: list[str] = []
        for start in range(0, 100, 10):
            rs = await asyncio.gather(
                *(
                    c.post("/v1/chat/completions", json=chat(f"plain {i}"))
                    for i in range(start, start + 10)
                )
            )
            assert [x.status_code for x in rs] == [200] * 10, [x.text for x in rs]
            ids += [x.headers["x-request-id"] for x in rs]
    return tools_id, ids


@pytest.fixture(
    scope="module", params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)]
)
def database(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """A migrated database: a SQLite file or a fresh PostgreSQL database."""
    if request.param == "sqlite":
        url = f"sqlite+aiosqlite:///{tmp_path_factory.mktemp('quar') / 'records.db'}"
    else:
        url = asyncio.run(create_pg_database(require_pg()))
    done = subprocess.run(
        [*servehall_cmd(), "db", "upgrade"],
        env={**os.environ, "SERVEHALL_DATABASE__URL": url},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    yield url
    if request.param == "postgresql":
        asyncio.run(drop_pg_database(url))


def test_a_bad_row_is_quarantined_and_nothing_is_replayed_twice(
    database: str,
    tmp_path: Path,
    demo_model_dir: Path,
    demo_config_factory: Callable[..., dict[str, Any]],
) -> None:
    url = database
    cfg = demo_config_factory(
        demo_model_dir,
        database={"url": url},
        sinks=[{"name": "sql", "required": True, "options": {"linger_s": 0.01}}],
        scheduler={"max_concurrency": 4, "max_queue": 256},
    )
    workdir = tmp_path / "server"
    spill = workdir / "servehall-spill-sql.jsonl"
    quarantine_file = workdir / "servehall-rejected-sql.jsonl"

    srv = start_server(cfg, workdir, name="quarantine", ready_timeout=600)
    try:
        # 1. tools (auto, text answer) + 100 plain: 101 rows
        tools_id, plain = asyncio.run(_traffic(srv.base_url))
        assert wait_count(url, "request_log", 101) == 101
        (row,) = query(url, f"SELECT tool_calls FROM request_log WHERE request_id = '{tools_id}'")
        assert row.tool_calls is not None  # a JSON list (the text answer's is [])
        assert count(url, "record_rejected") == 0

        # 2. the database refuses the next tools row: 100 rows + 1 quarantined record
        asyncio.run(reject_rows(url, "NEW.tool_calls IS NOT NULL"))
        bad_id, plain = asyncio.run(_traffic(srv.base_url))
        assert wait_count(url, "request_log", 201) == 201
        assert wait_count(url, "record_rejected", 1) == 1
        (kept,) = query(url, "SELECT sink, kind, request_id, error FROM record_rejected")
        assert (kept.sink, kept.kind, kept.request_id) == ("sql", "request", bad_id)
        assert REJECT_MESSAGE in kept.error
        rows = {r.request_id for r in query(url, "SELECT request_id FROM request_log")}
        assert bad_id not in rows and set(plain) <= rows
        with httpx.Client(base_url=srv.base_url, timeout=30) as c:
            assert c.get("/health/ready").status_code == 200  # one bad row: still ready
            metrics = c.get("/metrics").text
        assert 'servehall_records_rejected_total{sink="sql"} 1.0' in metrics
        log = srv.log_text()
        assert bad_id in log and "record_rejected" in log
    finally:
        srv.stop()
    assert not spill.exists() and not quarantine_file.exists()

    # 3. a restart replays nothing (twice or at all)
    again = start_server(cfg, workdir, name="quarantine", ready_timeout=600)
    try:
        with httpx.Client(base_url=again.base_url, timeout=30) as c:
            assert c.get("/health/ready").status_code == 200
            assert 'servehall_records_rejected_total{sink="sql"} 0.0' in c.get("/metrics").text
    finally:
        again.stop()
    assert "replay" not in again.log_text()
    assert count(url, "request_log") == 201 and count(url, "record_rejected") == 1
    assert not spill.exists()

    status = run_cli(srv.config_path, "db", "status", cwd=workdir)
    assert status.returncode == 0, status.stderr
    assert "quarantined records in record_rejected: 1 (sql: 1)" in status.stdout
