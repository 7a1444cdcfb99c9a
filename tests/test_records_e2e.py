"""One request-log row per request through the real server (Hypercorn, HTTP/2, demo
model) on SQLite and PostgreSQL: success, validation error, client disconnect, overload,
NUL text (C29); prompts stored only when configured, NUL stripped, no secret stored."""

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

from servehall.db.testing import create_pg_database, drop_pg_database, require_pg, run_sql
from servehall.testing.cli import servehall_cmd
from tests.conftest import stream_then_drop

CANARY = "sk-canary-4c1d7e0b9f2a"


def B(content: str, **extra: Any) -> dict[str, Any]:
    return {
        "model": "demo",
        "temperature": 0,
        "messages": [{"role": "user", "content": content}],
        **extra,
    }


def query(url: str, sql: str) -> list[Any]:
    return asyncio.run(run_sql(url, sql))


def wait_rows(url: str, n: int, timeout: float = 20.0) -> int:
    end = time.monotonic() + timeout
    count = -1
    while time.monotonic() < end:
        count = query(url, "SELECT count(*) FROM request_log")[0][0]
        if count >= n:
            return int(count)
        time.sleep(0.1)
    return int(count)


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def served(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    servehall_server: Callable[..., Any],
    demo_model_dir: Path,
    demo_config_factory: Callable[..., dict[str, Any]],
) -> Iterator[tuple[Any, str]]:
    if request.param == "sqlite":
        url = f"sqlite+aiosqlite:///{tmp_path_factory.mktemp('rec') / 'records.db'}"
        database = {"url": url, "store_prompts": True, "auto_migrate": True}
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
        database = {"url": url, "store_prompts": True}
    cfg = demo_config_factory(
        demo_model_dir,
        database=database,
        sinks=[{"name": "sql", "options": {"linger_s": 0.01}}],
        scheduler={"max_concurrency": 1, "max_queue": 0},
    )
    with servehall_server(cfg, name=f"records-{request.param}") as srv:
        yield srv, url
    if request.param == "postgresql":
        asyncio.run(drop_pg_database(url))


async def _overload(base_url: str) -> list[int]:
    async with httpx.AsyncClient(base_url=base_url, http2=True, timeout=60) as c:
        rs = await asyncio.gather(
            *(c.post("/v1/chat/completions", json=B("overload", max_tokens=48)) for _ in range(4))
        )
    return [r.status_code for r in rs]


def test_one_row_per_request(served: tuple[Any, str]) -> None:
    srv, url = served
    base = query(url, "SELECT count(*) FROM request_log")[0][0]
    sent = 0
    with httpx.Client(base_url=srv.base_url, http1=False, http2=True, timeout=60) as c:
        ok = c.post(
            "/v1/chat/completions",
            json=B("hello", max_tokens=2),
            headers={"Authorization": f"Bearer {CANARY}"},
        )
        sent += 1
        assert ok.status_code == 200, ok.text
        bad = c.post("/v1/chat/completions", json={"model": "demo", "messages": []})
        sent += 1
        assert bad.status_code == 400
        broken = c.post(
            "/v1/chat/completions",
            content=b"{not json",
            headers={"content-type": "application/json"},
        )
        sent += 1
        assert broken.status_code == 400
        # disconnect: a raw HTTP/1.1 socket closed after the first SSE event, on a request
        # long enough (4 x 1900 tokens) to be surely still generating when it leaves
        slow = {"model": "demo", "prompt": "ABCDEFGH ABCDEFGH ABC", "temperature": 0}
        slow["ignore_eos"] = True  # its length must not depend on the demo weights
        stream_then_drop(srv.port, {**slow, "max_tokens": 1900, "n": 4, "stream": True})
        sent += 1
        # the aborted request's row appears once it has left the engine (slot freed)
        assert wait_rows(url, base + sent) == base + sent
        time.sleep(0.1)
        nul = c.post("/v1/chat/completions", json=B("a\u0000b", max_tokens=2))
        sent += 1
        assert nul.status_code in (200, 400)
        lit = c.post("/v1/chat/completions", json=B("the literal \\u0000", max_tokens=2))
        sent += 1
        assert lit.status_code == 200
        lone = c.post(
            "/v1/chat/completions",
            content=b'{"model": "demo", "max_tokens": 2, "messages": '
            b'[{"role": "user", "content": "emoji \\ud83d"}]}',
            headers={"content-type": "application/json"},
        )
        sent += 1
        assert lone.status_code in (200, 400)  # C25: either way, the row is written
    statuses = asyncio.run(_overload(srv.base_url))
    sent += len(statuses)
    assert 503 in statuses and 200 in statuses, statuses

    assert wait_rows(url, base + sent) == base + sent
    time.sleep(0.3)  # nothing extra arrives later
    assert query(url, "SELECT count(*) FROM request_log")[0][0] == base + sent

    rows = query(url, "SELECT * FROM request_log")
    by_id = {r.request_id: r for r in rows}
    assert len(by_id) == len(rows)
    got = by_id[ok.json()["id"]]
    assert got.status_code == 200 and got.model == "demo" and got.finish_reason
    assert got.prompt_tokens > 0 and got.completion_tokens > 0 and got.latency_s > 0
    assert got.endpoint == "/v1/chat/completions" and got.client_addr
    codes = sorted(r.status_code for r in rows)
    assert codes.count(400) >= 2 and codes.count(503) >= 1
    assert any(r.error_code == "queue_full" for r in rows)
    assert any(r.finish_reason == "client_disconnect" for r in rows)
    texts = [r.prompt_text or "" for r in rows]
    assert any("ab" in t for t in texts) and not any("\x00" in t for t in texts)
    dump = repr(rows) + repr(query(url, "SELECT * FROM audit_event"))
    assert CANARY not in dump
