"""Scale-out end to end (docs/deploy.md): two real ``servehall serve`` replicas (demo
model, auth plugin) sharing the CI PostgreSQL (records, audit chain, keys) and a real
``redis-server`` (rate-limit buckets, key-change broadcast), then behind a real HAProxy.

Both replicas and HAProxy are started from the files of ``deploy/`` (``servehall.toml``
and ``haproxy.cfg``) with only addresses, the demo model and test secrets swapped in, so
the deployment files and this test describe the same topology. Replica A fails closed
when Redis is down (the default), replica B fails open.

In order (one deployment per module; each replica loads the demo model once):

1. a key with ``rpm = 10`` sending 20 requests alternated across A and B: exactly
   10 × 200 and 10 × 429;
2. a key revoked on A is refused on B within 1 s (key cache TTL set to 300 s);
3. 20 concurrent key creations on each replica leave a chain that ``servehall audit
   verify`` accepts;
4. Redis stopped: A answers 503 ``rate_limiter_unavailable`` + Retry-After (counted in
   ``/metrics``), B admits; Redis back: both limit again;
5. behind HAProxy, A drains on SIGTERM during load: the client sees no failed request;
6. B killed (SIGKILL) during load: every request whose response was complete has its
   ``request_log`` row (``commit_wait_s``).

Bad input (own short-lived processes): an unreachable ``limits_url`` at start-up is one
line; ``config check`` rejects a malformed ``limits_url``; a replica whose schema is
older than the database's refuses to start naming both revisions.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import os
import signal
import subprocess
import threading
import time
import tomllib
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from servehall.db.migrate import script_heads
from servehall.db.testing import create_pg_database, drop_pg_database, require_pg, run_sql
from servehall.testing.cli import servehall_cmd
from servehall_auth.testing import RedisServer, redis_server_binary
from tests.conftest import (
    ServerHandle,
    dump_toml,
    free_port,
    haproxy_binary,
    run_cli,
    run_haproxy,
)

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
PEPPER_ENV = "SERVEHALL_SCALE_PEPPER"
PEPPER = "scale-out-pepper-" + uuid.uuid4().hex
ENV = {PEPPER_ENV: PEPPER}


_haproxy_binary = haproxy_binary


pytestmark = [
    pytest.mark.postgres,
    pytest.mark.skipif(redis_server_binary() is None, reason="redis-server not installed"),
]


def replica_config(
    model_dir: Path, db_url: str, redis_url: str, replica: str, **auth: Any
) -> dict[str, Any]:
    """``deploy/servehall.toml`` with the demo model, the test database/Redis/pepper and
    cpu-light settings swapped in."""
    cfg = tomllib.loads((DEPLOY / "servehall.toml").read_text())
    model = cfg["models"][0]
    model["path"] = str(model_dir)
    model["options"] = {"inference_precision": "f32"}
    cfg["server"]["replica"] = replica
    cfg["server"]["graceful_timeout_s"] = 20
    cfg["database"]["url"] = db_url
    cfg["scheduler"] = {"max_concurrency": 2}
    cfg["auth"].update(
        {
            "pepper": {"env": PEPPER_ENV},
            "limits_url": redis_url,
            "key_cache_ttl_s": 300,  # only the broadcast can make a revocation quick
            **auth,
        }
    )
    return cfg


def chat(max_tokens: int = 1) -> dict[str, Any]:
    return {
        "model": "demo",
        "max_tokens": max_tokens,
        "temperature": 0,
        "messages": [{"role": "user", "content": "Hi"}],
    }


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


class Topology:
    def __init__(
        self, a: ServerHandle, b: ServerHandle, redis: RedisServer, db_url: str, work: Path
    ) -> None:
        self.a, self.b, self.redis, self.db_url, self.work = a, b, redis, db_url, work
        self.admin_key = ""

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        p = run_cli(self.a.config_path, *args, env=ENV, cwd=self.work)
        return p

    def create_key(self, *args: str) -> dict[str, Any]:
        p = self.cli("keys", "create", "--tenant", "scale", "--json", *args)
        assert p.returncode == 0, p.stderr
        data: dict[str, Any] = json.loads(p.stdout)
        return data

    def rows(self, sql: str) -> list[Any]:
        return asyncio.run(run_sql(self.db_url, sql))


@pytest.fixture(scope="module")
def topology(
    servehall_server: Any, demo_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Topology]:
    work = tmp_path_factory.mktemp("scale-out")
    db_url = asyncio.run(create_pg_database(require_pg()))
    redis = RedisServer().start()
    try:
        cfg_a = replica_config(demo_model_dir, db_url, redis.url, "replica-a")
        cfg_b = replica_config(
            demo_model_dir, db_url, redis.url, "replica-b", limits_on_error="open"
        )
        (work / "a.toml").write_text(dump_toml(cfg_a))
        p = run_cli(work / "a.toml", "db", "upgrade", env=ENV, cwd=work)
        assert p.returncode == 0, p.stderr
        # both replicas load the model at once (2 shared cores: lean settings above, and
        # a generous start-up allowance for a loaded CI machine)
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            kw = {"env": ENV, "ready_timeout": 600.0}
            fa = pool.submit(servehall_server, cfg_a, name="replica-a", **kw)
            fb = pool.submit(servehall_server, cfg_b, name="replica-b", **kw)
            a, b = fa.result(), fb.result()
        topo = Topology(a, b, redis, db_url, work)
        topo.admin_key = topo.create_key("--scopes", "inference,admin")["key"]
        yield topo
        a.stop()
        b.stop()
    finally:
        redis.close()
        asyncio.run(drop_pg_database(db_url))


# --- 1. shared limits ------------------------------------------------------------------


def test_rpm_10_across_two_replicas_gives_exactly_10(topology: Topology) -> None:
    key = topology.create_key("--rpm", "10")["key"]

    async def run() -> list[tuple[str, int, dict[str, str]]]:
        async with (
            httpx.AsyncClient(base_url=topology.a.base_url, http2=True, timeout=60) as ca,
            httpx.AsyncClient(base_url=topology.b.base_url, http2=True, timeout=60) as cb,
        ):
            clients = [("a", ca), ("b", cb)]

            async def one(i: int) -> tuple[str, int, dict[str, str]]:
                name, c = clients[i % 2]  # alternated: a, b, a, b, …
                r = await c.post("/v1/chat/completions", json=chat(), headers=bearer(key))
                return name, r.status_code, dict(r.headers)

            # all 20 at once: the whole burst is admitted long before one token refills
            # (10 rpm refills one request per 6 s)
            return await asyncio.gather(*(one(i) for i in range(20)))

    results = asyncio.run(run())
    codes = [code for _, code, _ in results]
    assert codes.count(200) == 10 and codes.count(429) == 10, results
    for _name, code, headers in results:
        assert headers["x-ratelimit-limit-requests"] == "10"
        if code == 429:
            assert int(headers["retry-after"]) >= 1
    # each replica answered 10 of the 20; with per-process buckets both would admit all
    assert sorted(n for n, _, _ in results) == ["a"] * 10 + ["b"] * 10


# --- 2. revocation broadcast -----------------------------------------------------------


def test_key_revoked_on_a_is_refused_on_b_within_1s(topology: Topology) -> None:
    key = topology.create_key()
    with (
        httpx.Client(base_url=topology.a.base_url, http2=True, timeout=60) as ca,
        httpx.Client(base_url=topology.b.base_url, http2=True, timeout=60) as cb,
    ):
        r = cb.post("/v1/chat/completions", json=chat(), headers=bearer(key["key"]))
        assert r.status_code == 200, r.text  # now cached on B for key_cache_ttl_s = 300 s
        r = ca.post(f"/admin/keys/{key['id']}/revoke", headers=bearer(topology.admin_key))
        assert r.status_code == 200, r.text
        revoked_at = time.monotonic()
        # every request B *receives* 1 s after the revocation must be refused (a slow
        # answer on a loaded machine does not count against B; an accepted late one does)
        while True:
            sent = time.monotonic()
            r = cb.post("/v1/chat/completions", json=chat(), headers=bearer(key["key"]))
            if r.status_code == 401:
                break
            assert r.status_code == 200, r.text
            assert sent - revoked_at < 1.0, "B still accepts the revoked key after 1 s"
            time.sleep(0.02)
        assert "revoked" in r.json()["error"]["message"]


# --- 3. one audit chain, many writers --------------------------------------------------


def test_concurrent_key_creations_on_both_replicas_leave_a_valid_chain(
    topology: Topology,
) -> None:
    async def run() -> list[int]:
        async with (
            httpx.AsyncClient(base_url=topology.a.base_url, http2=True, timeout=60) as ca,
            httpx.AsyncClient(base_url=topology.b.base_url, http2=True, timeout=60) as cb,
        ):

            async def create(c: httpx.AsyncClient, i: int) -> int:
                r = await c.post(
                    "/admin/keys",
                    json={"tenant": "chain", "name": f"k{i}"},
                    headers=bearer(topology.admin_key),
                )
                return r.status_code

            return await asyncio.gather(*(create(c, i) for i in range(20) for c in (ca, cb)))

    assert asyncio.run(run()) == [201] * 40
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        n = topology.rows(
            "SELECT COUNT(*) FROM audit_event WHERE action = 'key.created' AND "
            "details::text LIKE '%chain%'"
        )[0][0]
        if n >= 40:
            break
        time.sleep(0.2)
    assert n == 40
    p = topology.cli("audit", "verify")
    assert p.returncode == 0, p.stdout + p.stderr
    assert "ok" in (p.stdout + p.stderr).lower()


# --- 4. Redis outage -------------------------------------------------------------------


def _limiter_rejections(client: httpx.Client, key: str) -> float:
    text = client.get("/metrics", headers=bearer(key)).text
    for line in text.splitlines():
        if line.startswith("servehall_auth_limiter_errors_total{") and (
            'operation="acquire"' in line and 'outcome="rejected"' in line
        ):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_redis_down_fail_closed_on_a_open_on_b_and_recovery(topology: Topology) -> None:
    key = topology.create_key("--rpm", "1000")["key"]
    with (
        httpx.Client(base_url=topology.a.base_url, http2=True, timeout=60) as ca,
        httpx.Client(base_url=topology.b.base_url, http2=True, timeout=60) as cb,
    ):
        for c in (ca, cb):
            assert c.post("/v1/chat/completions", json=chat(), headers=bearer(key)).is_success
        before = _limiter_rejections(ca, topology.admin_key)
        topology.redis.stop()
        try:
            r = ca.post("/v1/chat/completions", json=chat(), headers=bearer(key))
            assert r.status_code == 503, r.text
            assert r.json()["error"]["code"] == "rate_limiter_unavailable"
            assert int(r.headers["retry-after"]) >= 1
            r = cb.post("/v1/chat/completions", json=chat(), headers=bearer(key))
            assert r.status_code == 200, r.text  # fail open
            assert _limiter_rejections(ca, topology.admin_key) >= before + 1
            assert "rate-limit store unreachable" in topology.a.log_text()
        finally:
            topology.redis.start()
        for c in (ca, cb):
            for _ in range(100):
                r = c.post("/v1/chat/completions", json=chat(), headers=bearer(key))
                if r.status_code == 200 and "x-ratelimit-remaining-requests" in r.headers:
                    break
                time.sleep(0.1)
            assert r.status_code == 200, r.text
            assert r.headers["x-ratelimit-limit-requests"] == "1000"  # limited again


# --- 5. draining behind HAProxy --------------------------------------------------------


class Load:
    """``workers`` threads sending chat requests to ``url`` until stopped; every outcome
    is kept (status code or exception, and the response id)."""

    def __init__(self, url: str, key: str, workers: int = 3, max_tokens: int = 8) -> None:
        self.url, self.key, self.max_tokens = url, key, max_tokens
        self.results: list[tuple[int | str, str | None]] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._run) for _ in range(workers)]

    def _run(self) -> None:
        with httpx.Client(base_url=self.url, timeout=60) as c:
            while not self._stop.is_set():
                try:
                    r = c.post(
                        "/v1/chat/completions",
                        json=chat(self.max_tokens),
                        headers=bearer(self.key),
                    )
                    rid = r.json().get("id") if r.status_code == 200 else None
                    out: tuple[int | str, str | None] = (r.status_code, rid)
                except Exception as exc:
                    out = (type(exc).__name__, None)
                with self._lock:
                    self.results.append(out)

    def ok(self) -> int:
        with self._lock:
            return sum(1 for code, _ in self.results if code == 200)

    def wait_ok(self, n: int, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while self.ok() < n:
            assert time.monotonic() < deadline, self.results[-5:]
            time.sleep(0.05)

    def __enter__(self) -> Load:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(120)


@pytest.fixture
def haproxy(topology: Topology, tmp_path: Path) -> Iterator[str]:
    binary = _haproxy_binary()
    if binary is None:
        pytest.skip("haproxy not installed (.ci/services.d/haproxy.sh)")
    # these replicas run no agent: nobody listens, HAProxy keeps the configured weight
    with run_haproxy(
        binary,
        f"127.0.0.1:{topology.a.port}",
        f"127.0.0.1:{topology.b.port}",
        free_port(),
        free_port(),
        tmp_path / "haproxy.log",
    ) as url:
        yield url


def test_drain_behind_haproxy_loses_no_request(topology: Topology, haproxy: str) -> None:
    created = topology.create_key()
    key = created["key"]
    with Load(haproxy, key) as load:
        load.wait_ok(6)
        topology.a.process.send_signal(signal.SIGTERM)  # A drains
        assert topology.a.process.wait(60) == 0
        seen = load.ok()
        load.wait_ok(seen + 6)  # B carries on alone
    failed = [r for r in load.results if r[0] != 200]
    assert not failed, f"{len(failed)} failed of {len(load.results)}: {failed[:5]}"
    rows = topology.rows(
        "SELECT replica, COUNT(*) FROM request_log WHERE principal_id = "
        f"'{created['id']}' GROUP BY replica"
    )
    served = {r[0]: r[1] for r in rows}
    assert served.get("replica-a", 0) >= 1 and served.get("replica-b", 0) >= 1, served
    assert sum(served.values()) == len(load.results)  # every request recorded


# --- 6. a killed replica loses no record -----------------------------------------------


def test_killed_replica_loses_no_record_of_completed_requests(topology: Topology) -> None:
    key = topology.create_key()["key"]
    with Load(topology.b.base_url, key, workers=3, max_tokens=4) as load:
        load.wait_ok(8)
        topology.b.process.kill()  # SIGKILL: no drain, no flush
        topology.b.process.wait(10)
    completed = [rid for code, rid in load.results if code == 200 and rid]
    assert len(completed) >= 8
    stored = {
        r[0]
        for r in topology.rows(
            "SELECT request_id FROM request_log WHERE replica = 'replica-b' AND status_code = 200"
        )
    }
    missing = [rid for rid in completed if rid not in stored]
    assert not missing, f"{len(missing)} of {len(completed)} completed requests unrecorded"


# --- bad input -------------------------------------------------------------------------


def test_unreachable_limits_url_at_startup_is_one_line(
    demo_model_dir: Path, tmp_path: Path
) -> None:
    port = free_port()  # nobody listens here
    cfg = replica_config(
        demo_model_dir, f"sqlite+aiosqlite:///{tmp_path / 'x.db'}", "", "r", api_keys=True
    )
    cfg["auth"]["limits_url"] = f"redis://:secretpw@127.0.0.1:{port}/0"
    cfg["database"]["auto_migrate"] = True
    (tmp_path / "c.toml").write_text(dump_toml(cfg))
    p = run_cli(
        tmp_path / "c.toml", "serve", "--bind", f"127.0.0.1:{free_port()}", env=ENV, cwd=tmp_path
    )
    assert p.returncode != 0
    assert "Traceback" not in p.stderr, p.stderr
    lines = [line for line in p.stderr.splitlines() if line.strip()]
    assert lines[-1].startswith(
        f"error: auth: cannot reach limits_url redis://:***@127.0.0.1:{port}/0: "
    ), p.stderr
    assert "secretpw" not in p.stderr + p.stdout


def config_check(path: Path) -> subprocess.CompletedProcess[str]:
    """``servehall config check FILE`` (a subprocess)."""
    return subprocess.run(
        [
            *servehall_cmd(),
            "config",
            "check",
            str(path),
        ],
        capture_output=True,
        text=True,
        env={**os.environ, **ENV},
        timeout=120,
    )


def test_config_check_validates_limits_url_form(demo_model_dir: Path, tmp_path: Path) -> None:
    cfg = replica_config(
        demo_model_dir, f"sqlite+aiosqlite:///{tmp_path / 'x.db'}", "redis://r:6379/0", "r"
    )
    (tmp_path / "ok.toml").write_text(dump_toml(cfg))
    ok = config_check(tmp_path / "ok.toml")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    cfg["auth"]["limits_url"] = "localhost:6379"
    (tmp_path / "bad.toml").write_text(dump_toml(cfg))
    bad = config_check(tmp_path / "bad.toml")
    assert bad.returncode != 0
    out = bad.stdout + bad.stderr
    assert "auth.limits_url" in out and "must start with redis://" in out, out
    assert "Traceback" not in out


def test_replica_older_than_database_schema_refuses_to_start(
    demo_model_dir: Path, tmp_path: Path
) -> None:
    db = f"sqlite+aiosqlite:///{tmp_path / 'newer.db'}"
    cfg = replica_config(demo_model_dir, db, "redis://127.0.0.1:1/0", "r")
    (tmp_path / "c.toml").write_text(dump_toml(cfg))
    assert run_cli(tmp_path / "c.toml", "db", "upgrade", env=ENV, cwd=tmp_path).returncode == 0
    # a newer release migrated the shared database past this one's head
    (head,) = script_heads()
    asyncio.run(
        run_sql(
            db,
            f"UPDATE alembic_version SET version_num = '0004_future' WHERE version_num = '{head}'",
        )
    )
    p = run_cli(
        tmp_path / "c.toml", "serve", "--bind", f"127.0.0.1:{free_port()}", env=ENV, cwd=tmp_path
    )
    assert p.returncode != 0
    assert "Traceback" not in p.stderr, p.stderr
    last = [line for line in p.stderr.splitlines() if line.strip()][-1]
    assert "database schema is newer than this servehall" in last, p.stderr
    assert "0004_future" in last and head in last
