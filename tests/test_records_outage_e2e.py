"""PostgreSQL goes away under load and comes back (a private cluster, pg_ctl stop/start):
every answered request still gets exactly one row; with ``required = true`` and the
buffer exhausted the server answers 503 and no answered request goes unrecorded."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from servehall.db.testing import PgCluster, private_cluster, run_sql


def B(content: str) -> dict[str, Any]:
    return {
        "model": "demo",
        "temperature": 0,
        "max_tokens": 1,
        "messages": [{"role": "user", "content": content}],
    }


def wait_count(url: str, where: str, n: int, timeout: float = 40.0) -> int:
    end = time.monotonic() + timeout
    got = -1
    while time.monotonic() < end:
        try:
            got = asyncio.run(run_sql(url, f"SELECT count(*) FROM request_log WHERE {where}"))[0][0]
        except OSError:
            got = -1
        if got >= n:
            return int(got)
        time.sleep(0.2)
    return int(got)


@pytest.fixture(scope="module")
def cluster() -> Iterator[PgCluster]:
    yield from private_cluster()


def _config(
    factory: Callable[..., dict[str, Any]],
    model: Path,
    url: str,
    sink: dict[str, Any],
) -> dict[str, Any]:
    return factory(
        model,
        database={"url": url},
        sinks=[sink],
        scheduler={"max_concurrency": 4, "max_queue": 256},
    )


def _fresh_config(
    factory: Callable[..., dict[str, Any]],
    model: Path,
    cluster: PgCluster,
    *,
    required: bool = False,
    **options: Any,
) -> dict[str, Any]:
    """Empty the cluster's request_log; a config with one ``sql`` sink on the cluster
    (retries from 0.05 s up to 0.3 s, no idle probe unless ``options`` set one: these
    tests are about failed writes, and a probe between two steps would change when the
    first refusal comes), ``required`` as given."""
    asyncio.run(run_sql(cluster.url, "DELETE FROM request_log"))
    sink: dict[str, Any] = {
        "name": "sql",
        "required": required,
        "options": {
            "retry_initial_s": 0.05,
            "retry_max_s": 0.3,
            "check_interval_s": 0,
            **options,
        },
    }
    return _config(factory, model, cluster.url, sink)


async def _load(base_url: str, cluster: PgCluster) -> tuple[int, list[int]]:
    """4 clients send requests for ~5 s; PostgreSQL is down from 1 s to ~3 s."""
    statuses: list[int] = []
    stop = asyncio.Event()

    async def client(k: int) -> None:
        async with httpx.AsyncClient(base_url=base_url, http2=True, timeout=60) as c:
            i = 0
            while not stop.is_set():
                r = await c.post("/v1/chat/completions", json=B(f"load {k} {i}"))
                statuses.append(r.status_code)
                i += 1

    tasks = [asyncio.create_task(client(k)) for k in range(4)]
    await asyncio.sleep(1.0)
    before = len(statuses)
    await asyncio.to_thread(cluster.stop, "fast")
    await asyncio.sleep(2.0)
    await asyncio.to_thread(cluster.start)
    await asyncio.sleep(1.5)
    stop.set()
    await asyncio.gather(*tasks)
    return before, statuses


def test_outage_under_load_loses_no_row(
    cluster: PgCluster,
    servehall_server: Callable[..., Any],
    demo_model_dir: Path,
    demo_config_factory: Callable[..., dict[str, Any]],
) -> None:
    cfg = _fresh_config(
        demo_config_factory, demo_model_dir, cluster, buffer=20, batch_size=10, linger_s=0.005
    )
    with servehall_server(cfg, name="outage") as srv:
        before, statuses = asyncio.run(_load(srv.base_url, cluster))
        answered = len(statuses)
        assert answered - before > 20, "too little load during the outage to exhaust memory"
        assert set(statuses) == {200}, set(statuses)
        assert wait_count(cluster.url, "true", answered) == answered
        time.sleep(0.5)
        assert wait_count(cluster.url, "true", answered + 1, timeout=0.5) == answered
        spill = srv.log_path.parent / "servehall-spill-sql.jsonl"
        assert "spilling to" in srv.log_text()
        assert not spill.exists()  # replayed and removed


def test_required_sink_fails_closed(
    cluster: PgCluster,
    servehall_server: Callable[..., Any],
    demo_model_dir: Path,
    demo_config_factory: Callable[..., dict[str, Any]],
) -> None:
    cfg = _fresh_config(
        demo_config_factory,
        demo_model_dir,
        cluster,
        required=True,
        buffer=8,
        spill=False,
        retry_after_s=2,
    )
    with (
        servehall_server(cfg, name="failclosed") as srv,
        httpx.Client(base_url=srv.base_url, http2=True, http1=False, timeout=60) as c,
    ):
        assert c.post("/v1/chat/completions", json=B("warm")).status_code == 200
        cluster.stop("fast")
        ok_ids: list[str] = ["warm"]
        refused = 0
        for i in range(40):
            r = c.post("/v1/chat/completions", json=B(f"during {i}"))
            if r.status_code == 200:
                ok_ids.append(r.json()["id"])
                continue
            assert r.status_code == 503, r.text
            err = r.json()["error"]
            assert err["code"] == "records_unavailable"
            assert r.headers["retry-after"] == "2"
            refused += 1
            if refused >= 5:
                break
        assert refused == 5 and len(ok_ids) - 1 >= 4  # the buffer (8) took some first
        cluster.start()
        wait_count(cluster.url, "status_code = 200", len(ok_ids))
        rows = asyncio.run(
            run_sql(cluster.url, "SELECT request_id FROM request_log WHERE status_code = 200")
        )
        stored = {r.request_id for r in rows}
        assert set(ok_ids[1:]) <= stored  # nothing answered went unrecorded
        assert len(stored) == len(ok_ids)
        end = time.monotonic() + 20
        while time.monotonic() < end:
            r = c.post("/v1/chat/completions", json=B("after"))
            if r.status_code == 200:
                break
            time.sleep(0.3)
        assert r.status_code == 200


def _ready(c: httpx.Client) -> tuple[int, dict[str, Any]]:
    r = c.get("/health/ready")
    return r.status_code, r.json()


def _wait_ready(c: httpx.Client, status: int, timeout: float = 30.0) -> dict[str, Any]:
    end = time.monotonic() + timeout
    while True:
        got, body = _ready(c)
        if got == status or time.monotonic() > end:
            assert got == status, body
            return body
        time.sleep(0.1)


@pytest.mark.parametrize("mode", ["when_exhausted", "at_once"])
def test_fail_closed_refusals_are_recorded_and_ready_names_the_sink(
    mode: str,
    cluster: PgCluster,
    servehall_server: Callable[..., Any],
    demo_model_dir: Path,
    demo_config_factory: Callable[..., dict[str, Any]],
) -> None:
    """P03: a required sink with a small buffer and no spill; PostgreSQL stops; 10 chat
    requests; PostgreSQL starts. Every answered request — the 503 refusals included —
    has exactly one row; ``/health/ready`` is 503 naming the sink while it cannot record,
    and 200 again once it records. ``fail_closed = "at_once"`` refuses from the first
    failed write, with room left in the buffer."""
    options: dict[str, Any] = {"buffer": 2, "spill": False, "retry_after_s": 3}
    if mode == "at_once":
        options = {"fail_closed": "at_once", "spill": False, "retry_after_s": 3}
    cfg = _fresh_config(demo_config_factory, demo_model_dir, cluster, required=True, **options)
    with (
        servehall_server(cfg, name=f"p03-{mode}") as srv,
        httpx.Client(base_url=srv.base_url, http2=True, http1=False, timeout=60) as c,
    ):
        first = c.post("/v1/chat/completions", json=B("before"))
        assert first.status_code == 200
        assert wait_count(cluster.url, "true", 1) == 1
        cluster.stop("fast")
        answered: dict[str, int] = {}
        ready_seen: list[int] = []
        for i in range(10):
            r = c.post("/v1/chat/completions", json=B(f"during {i}"))
            answered[r.headers["x-request-id"]] = r.status_code
            if r.status_code != 200:
                assert r.status_code == 503, r.text
                assert r.json()["error"]["code"] == "records_unavailable"
                assert r.headers["retry-after"] == "3"
            else:
                assert mode == "when_exhausted" or not ready_seen, "at_once admitted late"
            if i == 0:
                # the first record's write fails: the sink cannot record → not ready
                body = _wait_ready(c, 503)
                assert body["sinks"]["sql"]["ready"] is False
                assert "cannot write" in body["sinks"]["sql"]["reason"]
                ready_seen.append(503)
        statuses = list(answered.values())
        refused = statuses.count(503)
        if mode == "at_once":
            assert statuses[0] == 200 and refused == 9, statuses
        else:
            # the buffer (2) takes the first answered records, then every request is refused
            assert statuses[:2] == [200, 200] and refused == 8, statuses
        assert _ready(c)[0] == 503
        cluster.start()
        total = 1 + len(answered)
        assert wait_count(cluster.url, "true", total) == total
        rows = asyncio.run(
            run_sql(
                cluster.url,
                "SELECT request_id, status_code, error_code FROM request_log "
                "WHERE prompt_tokens >= 0",
            )
        )
        by_id = {r.request_id: (r.status_code, r.error_code) for r in rows}
        assert len(rows) == total and len(by_id) == total  # exactly one row each
        for rid, status in answered.items():
            assert by_id[rid][0] == status
            if status == 503:
                assert by_id[rid][1] == "records_unavailable"
        _wait_ready(c, 200)
        assert c.post("/v1/chat/completions", json=B("after")).status_code == 200


def test_ready_sees_a_database_outage_without_traffic(
    cluster: PgCluster,
    servehall_server: Callable[..., Any],
    demo_model_dir: Path,
    demo_config_factory: Callable[..., dict[str, Any]],
) -> None:
    """A required ``sql`` sink and no requests at all: PostgreSQL stops, and the idle
    probe (``check_interval_s``) turns ``/health/ready`` 503 naming the sink; it starts,
    and ready is 200 again — before any request was sent."""
    cfg = _fresh_config(
        demo_config_factory, demo_model_dir, cluster, required=True, check_interval_s=0.3
    )
    with (
        servehall_server(cfg, name="idle-probe") as srv,
        httpx.Client(base_url=srv.base_url, http2=True, http1=False, timeout=60) as c,
    ):
        _wait_ready(c, 200)
        cluster.stop("fast")
        try:
            body = _wait_ready(c, 503)
            assert body["sinks"]["sql"]["ready"] is False
            assert "cannot write" in body["sinks"]["sql"]["reason"]
        finally:
            cluster.start()
        _wait_ready(c, 200)
        assert c.post("/v1/chat/completions", json=B("after")).status_code == 200


def test_hung_database_fails_closed_within_write_timeout(
    cluster: PgCluster,
    servehall_server: Callable[..., Any],
    demo_model_dir: Path,
    demo_config_factory: Callable[..., dict[str, Any]],
) -> None:
    """Every PostgreSQL process stopped with SIGSTOP (it hangs; nothing refuses): a
    required sink with ``fail_closed = "at_once"`` and ``write_timeout_s = 1`` turns
    the chat API into 503 ``records_unavailable`` and ``/health/ready`` into 503 within
    the timeout (plus margin); after SIGCONT every answered request has its row."""
    cfg = _fresh_config(
        demo_config_factory,
        demo_model_dir,
        cluster,
        required=True,
        fail_closed="at_once",
        write_timeout_s=1,
        check_interval_s=1,
        retry_after_s=2,
    )
    cfg["database"]["command_timeout_s"] = 60  # the runner's timeout is what must act
    with (
        servehall_server(cfg, name="hung-db") as srv,
        httpx.Client(base_url=srv.base_url, http2=True, http1=False, timeout=60) as c,
    ):
        assert c.post("/v1/chat/completions", json=B("before")).status_code == 200
        assert wait_count(cluster.url, "true", 1) == 1
        answered: dict[str, int] = {}
        cluster.pause()
        try:
            t0 = time.monotonic()
            refused_at = ready_at = None
            while time.monotonic() - t0 < 20 and (refused_at is None or ready_at is None):
                r = c.post("/v1/chat/completions", json=B("during"))
                answered[r.headers["x-request-id"]] = r.status_code
                if r.status_code == 503 and refused_at is None:
                    assert r.json()["error"]["code"] == "records_unavailable"
                    refused_at = time.monotonic() - t0
                if _ready(c)[0] == 503 and ready_at is None:
                    ready_at = time.monotonic() - t0
                time.sleep(0.05)
            assert refused_at is not None and refused_at < 6, refused_at
            assert ready_at is not None and ready_at < 6, ready_at
            time.sleep(1.0)
            assert _ready(c)[0] == 503
        finally:
            cluster.resume()
        total = 1 + len(answered)
        assert wait_count(cluster.url, "true", total) == total
        rows = asyncio.run(run_sql(cluster.url, "SELECT request_id, status_code FROM request_log"))
        by_id = {r.request_id: r.status_code for r in rows}
        assert len(rows) == total
        for rid, status in answered.items():
            assert by_id[rid] == status  # nothing accepted is lost, refusals recorded too
        _wait_ready(c, 200)
        assert c.post("/v1/chat/completions", json=B("after")).status_code == 200
