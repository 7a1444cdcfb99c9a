"""Config revisions across two replicas sharing PostgreSQL and Redis (docs/versions.md).

Two real ``servehall serve`` replicas follow the revisions in one PostgreSQL database,
woken by Redis pub/sub (``[server] config_broadcast_url``) with a slow table poll
(``config_poll_s = 10``) as the catch-up: ``servehall config apply`` and ``config
rollback`` reach both within about a second; a revision stored while Redis is down
still reaches both. The config holds literal secrets (the PostgreSQL password in the
database URL, a tracing header's token): no ``config_revision`` row and no
``/admin/config`` answer holds them.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from servehall.db.testing import create_pg_database, drop_pg_database, require_pg, run_sql
from servehall_auth.testing import RedisServer, redis_server_binary
from tests.conftest import ServerHandle, run_cli
from tests.test_versions_e2e import HEADER, completion, versions_config

pytestmark = [pytest.mark.postgres]

TRACE_TOKEN = "Bearer e2e-literal-trace-token-5f1c"


def replica_config(
    model_dir: Path, db_url: str, redis_url: str, versions: list[tuple[str, float]]
) -> str:
    """Both replicas' config: revisions announced over Redis, polled every 10 s; literal
    secrets in the database URL (PostgreSQL's password) and a tracing header."""
    return versions_config(
        model_dir,
        db_url,
        versions,
        server={"config_poll_s": 10, "config_broadcast_url": redis_url},
        more={"tracing": {"headers": {"authorization": TRACE_TOKEN}}},
    )


class Replicas:
    def __init__(
        self,
        a: ServerHandle,
        b: ServerHandle,
        db_url: str,
        redis: RedisServer,
        model_dir: Path,
        work: Path,
    ) -> None:
        self.a, self.b, self.db_url, self.redis = a, b, db_url, redis
        self.model_dir, self.work = model_dir, work

    def config(self, versions: list[tuple[str, float]]) -> str:
        return replica_config(self.model_dir, self.db_url, self.redis.url, versions)

    def cli(self, *args: str) -> Any:
        return run_cli(self.a.config_path, *args, env={}, cwd=self.work)


@contextlib.contextmanager
def replica_pair(
    servehall_server: Any, config: Callable[[str, str], str], prefix: str
) -> Iterator[tuple[ServerHandle, ServerHandle, str, RedisServer]]:
    """Two replicas (``<prefix>-a``, ``<prefix>-b``) started together from
    ``config(db_url, redis_url)`` on a fresh PostgreSQL database and a Redis server of
    their own: ``(a, b, db_url, redis)``; stopped, and the database dropped, afterwards.
    Skips without redis-server (or PostgreSQL, as :func:`require_pg`)."""
    if redis_server_binary() is None:
        pytest.skip("redis-server is not installed (.ci/services.d/redis.sh)")
    db_url = asyncio.run(create_pg_database(require_pg()))
    redis = RedisServer().start()
    try:
        text = config(db_url, redis.url)
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            kw = {"ready_timeout": 600.0}
            fa = pool.submit(servehall_server, text, name=f"{prefix}-a", **kw)
            fb = pool.submit(servehall_server, text, name=f"{prefix}-b", **kw)
            a, b = fa.result(), fb.result()
        try:
            yield a, b, db_url, redis
        finally:
            a.stop()
            b.stop()
    finally:
        redis.close()
        asyncio.run(drop_pg_database(db_url))


@pytest.fixture(scope="module")
def replicas(
    servehall_server: Any, demo_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Replicas]:
    work = tmp_path_factory.mktemp("versions-replicas")

    def config(db_url: str, redis_url: str) -> str:
        return replica_config(demo_model_dir, db_url, redis_url, [("v1", 1)])

    with replica_pair(servehall_server, config, "rev") as (a, b, db_url, redis):
        yield Replicas(a, b, db_url, redis, demo_model_dir, work)


def _ready(c: httpx.Client, srv: ServerHandle) -> dict[str, Any]:
    return c.get(srv.base_url + "/health/ready").json()["config"]  # type: ignore[no-any-return]


def _versions(c: httpx.Client, srv: ServerHandle) -> set[str]:
    seen = set()
    for i in range(8):
        r = c.post(srv.base_url + "/v1/completions", json=completion(f"r{i}"))
        assert r.status_code == 200, r.text
        seen.add(r.headers[HEADER])
    return seen


def _both_at(c: httpx.Client, dep: Replicas, revision: int, limit: float) -> float:
    """Seconds until both replicas report ``revision`` in /health/ready."""
    t0 = time.monotonic()
    while True:
        revs = [_ready(c, s)["revision"] for s in (dep.a, dep.b)]
        if revs == [revision, revision]:
            return time.monotonic() - t0
        assert time.monotonic() - t0 < limit, revs
        time.sleep(0.02)


def test_apply_and_rollback_reach_both_replicas_at_once_over_redis(replicas: Replicas) -> None:
    dep = replicas
    with httpx.Client(timeout=60) as c:
        for srv in (dep.a, dep.b):
            assert _ready(c, srv) == {
                "revision": 1,
                "hash": _ready(c, dep.a)["hash"],
                "broadcast": "subscribed",
            }
            assert _versions(c, srv) == {"v1"}
        f = dep.work / "v2.toml"
        f.write_text(dep.config([("v1", 0), ("v2", 1)]))
        p = dep.cli("config", "apply", str(f))
        assert p.returncode == 0, p.stderr
        # a new version starts a worker on each replica first: allow for that
        _both_at(c, dep, 2, 60)
        assert _versions(c, dep.a) == {"v2"} and _versions(c, dep.b) == {"v2"}
        p = dep.cli("config", "rollback")
        assert p.returncode == 0, p.stderr
        took = _both_at(c, dep, 3, 5.0)
        assert _versions(c, dep.a) == {"v1"} and _versions(c, dep.b) == {"v1"}
    # the poll runs every 10 s: only the announcement explains this
    assert took < 3.0, took
    print(f"rollback reached both replicas in {took:.2f} s (poll every 10 s)")


def test_a_revision_stored_while_redis_is_down_still_reaches_both(replicas: Replicas) -> None:
    dep = replicas
    f = dep.work / "weights.toml"
    f.write_text(dep.config([("v1", 2)]))
    dep.redis.stop()
    try:
        p = dep.cli("config", "apply", str(f))
        assert p.returncode == 0, p.stderr
        assert "could not announce config revision 4" in p.stderr, p.stderr
    finally:
        dep.redis.start()
    with httpx.Client(timeout=60) as c:
        # the poll (10 s) or the listener's catch-up after it subscribes again
        took = _both_at(c, dep, 4, 25.0)
        assert [_ready(c, s)["broadcast"] for s in (dep.a, dep.b)] == ["subscribed"] * 2
    print(f"revision 4 (not announced) reached both replicas in {took:.2f} s")


def test_no_revision_row_or_admin_answer_holds_a_literal_secret(replicas: Replicas) -> None:
    dep = replicas
    password = f":{dep.db_url.split(':')[2].split('@')[0]}@"
    rows = asyncio.run(
        run_sql(dep.db_url, "SELECT revision, text, diff FROM config_revision ORDER BY revision")
    )
    assert [r[0] for r in rows] == [1, 2, 3, 4]
    for _, text, diff in rows:
        for stored in (text, diff):
            assert dep.db_url not in stored and password not in stored
            assert TRACE_TOKEN not in stored and "e2e-literal" not in stored
        # the database URL, the tracing header and the Redis URL (a Secret field)
        assert text.count("{redacted = true}") == 3, text
    with httpx.Client(timeout=60) as c:
        for srv in (dep.a, dep.b):
            shown = c.get(srv.base_url + "/admin/config").json()["text"]
            assert password not in shown and TRACE_TOKEN not in shown
            assert "{redacted = true}" in shown
    hist = dep.cli("config", "history", "--diff")
    assert hist.returncode == 0, hist.stderr
    assert password not in hist.stdout and TRACE_TOKEN not in hist.stdout
