"""Two ``servehall serve`` replicas on one PostgreSQL database share a batch: both run
lines of it (``request_log.replica``), every ``custom_id`` runs once (one request record
each, once in the result files); a batch cancelled through either replica stops on
both. Skips without PostgreSQL (fails under CI, as the other PostgreSQL tests)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from servehall.db.testing import create_pg_database, drop_pg_database, require_pg, run_sql
from tests.conftest import ServerHandle, demo_config, dump_toml, run_cli


def chat(text: str, max_tokens: int) -> dict[str, Any]:
    return {
        "model": "demo",
        "messages": [{"role": "user", "content": text}],
        "temperature": 0,
        "max_tokens": max_tokens,
    }


def jsonl(bodies: dict[str, dict[str, Any]]) -> bytes:
    return "".join(
        json.dumps({"custom_id": k, "method": "POST", "url": "/v1/chat/completions", "body": v})
        + "\n"
        for k, v in bodies.items()
    ).encode()


class Pair:
    def __init__(self, a: ServerHandle, b: ServerHandle, db_url: str) -> None:
        self.a, self.b, self.db_url = a, b, db_url

    def client(self, server: ServerHandle) -> openai.OpenAI:
        return openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0)

    def rows(self, sql: str) -> list[Any]:
        return asyncio.run(run_sql(self.db_url, sql))


@pytest.fixture(scope="module")
def pair(
    servehall_server: Any, demo_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Pair]:
    work = tmp_path_factory.mktemp("batch-replicas")
    db_url = asyncio.run(create_pg_database(require_pg()))
    try:

        def cfg(name: str) -> dict[str, Any]:
            return demo_config(
                demo_model_dir,
                server={"replica": name},
                database={"url": db_url},
                sinks=[{"name": "sql", "options": {"linger_s": 0.05}}],
                files={"dir": str(work / "store")},  # one directory for both replicas
                batches={"poll_s": 0.1, "max_concurrent_lines": 2},
            )

        (work / "a.toml").write_text(dump_toml(cfg("replica-a")))
        p = run_cli(work / "a.toml", "db", "upgrade", cwd=work)
        assert p.returncode == 0, p.stderr
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            kw = {"ready_timeout": 600.0}
            fa = pool.submit(servehall_server, cfg("replica-a"), name="replica-a", **kw)
            fb = pool.submit(servehall_server, cfg("replica-b"), name="replica-b", **kw)
            a, b = fa.result(), fb.result()
        yield Pair(a, b, db_url)
        a.stop()
        b.stop()
    finally:
        asyncio.run(drop_pg_database(db_url))


def submit(client: openai.OpenAI, bodies: dict[str, dict[str, Any]], tmp: Path) -> Any:
    path = tmp / "in.jsonl"
    path.write_bytes(jsonl(bodies))
    with path.open("rb") as f:
        made = client.files.create(file=f, purpose="batch")
    return client.batches.create(
        input_file_id=made.id, endpoint="/v1/chat/completions", completion_window="24h"
    )


def wait_done(client: openai.OpenAI, batch_id: str, timeout: float = 600) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        got = client.batches.retrieve(batch_id)
        if got.status in ("completed", "expired", "cancelled"):
            return got
        assert time.monotonic() < deadline, got
        time.sleep(0.3)


def test_two_replicas_share_one_batch(pair: Pair, tmp_path: Path) -> None:
    bodies = {f"r-{i}": chat(f"Count the stars {i}", 24) for i in range(40)}
    batch = submit(pair.client(pair.a), bodies, tmp_path)
    done = wait_done(pair.client(pair.b), batch.id)  # either replica answers
    assert done.status == "completed" and done.request_counts.completed == 40
    client = pair.client(pair.a)
    out = [
        json.loads(x)
        for x in client.files.content(done.output_file_id).read().decode().splitlines()
    ]
    assert sorted(x["custom_id"] for x in out) == sorted(bodies)
    deadline = time.monotonic() + 15
    while True:
        rows = pair.rows(
            f"SELECT custom_id, replica FROM request_log WHERE batch_id = '{batch.id}'"
        )
        if len(rows) >= 40 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert sorted(r[0] for r in rows) == sorted(bodies)  # each line ran once
    assert {r[1] for r in rows} == {"replica-a", "replica-b"}  # both took a share


def test_cancel_through_either_replica_stops_both(pair: Pair, tmp_path: Path) -> None:
    bodies = {f"c-{i}": chat(f"Write a long story {i}", 64) for i in range(80)}
    batch = submit(pair.client(pair.a), bodies, tmp_path)
    deadline = time.monotonic() + 120
    while pair.client(pair.a).batches.retrieve(batch.id).request_counts.completed < 2:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert pair.client(pair.b).batches.cancel(batch.id).status == "cancelling"
    done = wait_done(pair.client(pair.a), batch.id, timeout=120)
    assert done.status == "cancelled"
    ran = done.request_counts.completed + done.request_counts.failed
    assert ran < len(bodies)
    time.sleep(1.5)
    count = pair.rows(f"SELECT COUNT(*) FROM request_log WHERE batch_id = '{batch.id}'")[0][0]
    assert count == ran  # no replica started a line after the cancel
