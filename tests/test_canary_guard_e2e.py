"""The canary guard across two real replicas sharing PostgreSQL and Redis
(docs/versions.md, "Guarded canary").

Model ``m`` is served as ``v1`` and a guarded canary ``c`` (the paced ``null`` engine;
``c`` slow) with one slot per version and a short queue timeout. Replica A is the only
one that sees the canary's traffic beside one long request that holds its slot, and all
of it is refused before admission (503 ``queue_timeout``): the guard counts those
refusals (no request of ``c`` failed once admitted), rolls ``c``
back, and stores it as a config revision (audited with the reason and the figures) that
replica B — which never judged anything — applies too. An operator's later unrelated
``servehall config apply`` keeps it, B restarted keeps it, and an apply that sets the
canary's weight brings it back on both.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from servehall.db.testing import run_sql
from servehall_auth.testing import RedisServer
from tests.conftest import ServerHandle, run_cli
from tests.test_versions_e2e import HEADER, completion, versions_config
from tests.test_versions_replicas_e2e import replica_pair

pytestmark = [pytest.mark.postgres]

RULE = {"error_rate_above": 0.3, "min_requests": 8, "window_s": 120}


def guard_config(
    model_dir: Path,
    db_url: str,
    redis_url: str,
    canary_weight: float = 1,
    v1: dict[str, Any] | None = None,
) -> str:
    """Both replicas' config: ``v1`` (fast; ``v1`` adds keys to its entry) and the
    guarded canary ``c`` (2 tokens/s); one running request per version, 0.5 s in the
    queue at most; revisions over Redis, a slow table poll."""
    return versions_config(
        model_dir,
        db_url,
        [("v1", 1), ("c", canary_weight)],
        extra={"c": {"options": {"tokens_per_s": 2}, "rollback_if": RULE}, "v1": v1 or {}},
        server={"config_poll_s": 10, "config_broadcast_url": redis_url},
        more={"scheduler": {"max_concurrency": 1, "queue_timeout_s": 0.5}},
    )


class Pair:
    def __init__(self, a: ServerHandle, b: ServerHandle, db_url: str, redis: RedisServer) -> None:
        self.a, self.b, self.db_url, self.redis = a, b, db_url, redis

    def rows(self, sql: str) -> list[Any]:
        return asyncio.run(run_sql(self.db_url, sql))


@pytest.fixture(scope="module")
def pair(servehall_server: Any, demo_model_dir: Path) -> Iterator[Pair]:
    def config(db_url: str, redis_url: str) -> str:
        return guard_config(demo_model_dir, db_url, redis_url)

    with replica_pair(servehall_server, config, "guard") as (a, b, db_url, redis):
        dep = Pair(a, b, db_url, redis)
        yield dep
        dep.b.stop()  # the test restarts B


def _versions(c: httpx.Client, srv: ServerHandle, tag: str, n: int = 24) -> set[str]:
    """The versions that ``n`` distinct callers are routed to (50/50 while both serve)."""
    seen = set()
    for i in range(n):
        r = c.post(srv.base_url + "/v1/completions", json=completion(f"{tag}{i}", max_tokens=1))
        assert r.status_code == 200, r.text
        seen.add(r.headers[HEADER])
    return seen


def _admin_text(c: httpx.Client, srv: ServerHandle) -> str:
    return str(c.get(srv.base_url + "/admin/config").json()["text"])


def _revision(c: httpx.Client, srv: ServerHandle) -> int | None:
    revision = c.get(srv.base_url + "/health/ready").json()["config"]["revision"]
    return int(revision) if revision is not None else None


def _wait(pred: Any, timeout: float, what: str) -> float:
    t0 = time.monotonic()
    while not pred():
        assert time.monotonic() - t0 < timeout, f"not within {timeout} s: {what}"
        time.sleep(0.05)
    return time.monotonic() - t0


def _overload_canary(c: httpx.Client, srv: ServerHandle) -> list[int]:
    """Hold the canary's only slot with long pinned requests and send pinned requests
    beside them (each refused before admission) until the guard takes it out; the
    statuses of the refused ones."""
    url = srv.base_url + "/v1/completions"
    pin = {HEADER: "c"}
    statuses: list[int] = []
    holders: list[threading.Thread] = []

    def hold() -> None:
        with httpx.Client(timeout=120) as h:
            h.post(url, json=completion("holder", max_tokens=8), headers=pin)

    deadline = time.monotonic() + 60
    while "rolled_back" not in _admin_text(c, srv):
        assert time.monotonic() < deadline, statuses
        if not any(t.is_alive() for t in holders):
            holders.append(threading.Thread(target=hold, daemon=True))
            holders[-1].start()
            time.sleep(0.5)  # let it take the slot
        r = c.post(url, json=completion("refused", max_tokens=1), headers=pin)
        if r.status_code == 503:
            assert r.json()["error"]["code"] == "queue_timeout", r.text
        statuses.append(r.status_code)
        time.sleep(0.1)
    for t in holders:
        t.join(60)
    return statuses


def test_refusals_roll_the_canary_back_on_every_replica_and_it_sticks(
    pair: Pair, demo_model_dir: Path, servehall_server: Any, tmp_path: Path
) -> None:
    with httpx.Client(timeout=60) as c:
        assert _versions(c, pair.a, "a") == {"v1", "c"}
        assert _versions(c, pair.b, "b") == {"v1", "c"}
        statuses = _overload_canary(c, pair.a)
        assert statuses.count(503) >= RULE["min_requests"] * RULE["error_rate_above"]
        assert set(statuses) <= {503, 200}
        took = _wait(lambda: "rolled_back" in _admin_text(c, pair.b), 5, "B follows")
        for srv, tag in ((pair.a, "a2"), (pair.b, "b2")):
            assert _versions(c, srv, tag) == {"v1"}
        pinned = c.post(
            pair.b.base_url + "/v1/completions",
            json=completion(max_tokens=1),
            headers={HEADER: "c"},
        )
        assert pinned.status_code == 200 and pinned.headers[HEADER] == "c"  # pins still work
    print(f"the rollback reached replica B {took:.2f} s after A showed it")

    # stored: a revision by A's guard, with the rolled_back table, audited with figures
    revs = pair.rows("SELECT revision, applied_by, text FROM config_revision ORDER BY revision")
    assert [r[0] for r in revs] == [1, 2]
    assert revs[1][1].startswith("guard:")
    assert 'rolled_back = {weight = 1, reason = "error_rate"' in revs[1][2]
    events = pair.rows(
        "SELECT target, details FROM audit_event WHERE action = 'model.canary_rollback'"
    )
    assert len(events) == 1 and events[0][0] == "m@c"
    details = events[0][1] if isinstance(events[0][1], dict) else json.loads(events[0][1])
    assert details["revision"] == 2 and details["reason"] == "error_rate"
    assert details["requests"] >= RULE["min_requests"]
    assert details["errors"] / details["requests"] > RULE["error_rate_above"]
    assert details["replica"] == revs[1][1].removeprefix("guard:")

    # an unrelated apply keeps it (the operator's file still says weight 1 for c)
    op = tmp_path / "op.toml"
    op.write_text(
        guard_config(demo_model_dir, pair.db_url, pair.redis.url, v1={"idle_unload_s": 3600})
    )
    p = run_cli(pair.a.config_path, "config", "apply", str(op), env={}, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert "m@c: kept at weight 0" in p.stderr, p.stderr
    with httpx.Client(timeout=60) as c:
        for srv in (pair.a, pair.b):
            _wait(lambda s=srv: _revision(c, s) == 3, 10, "revision 3 on both")
        assert _versions(c, pair.a, "a3") == {"v1"} and _versions(c, pair.b, "b3") == {"v1"}

    # B restarted from the operator's file: still rolled back, the revision adopted
    pair.b.stop()
    pair.b = servehall_server(op.read_text(), name="guard-b2", ready_timeout=600.0)
    with httpx.Client(timeout=60) as c:
        assert _revision(c, pair.b) == 3
        assert _versions(c, pair.b, "b4") == {"v1"}
    assert "canary rollback of m@c kept from revision 3" in pair.b.log_text()

    # an explicit weight brings the canary back on both
    op.write_text(guard_config(demo_model_dir, pair.db_url, pair.redis.url, canary_weight=3))
    p = run_cli(pair.a.config_path, "config", "apply", str(op), env={}, cwd=tmp_path)
    assert p.returncode == 0 and "kept" not in p.stderr, p.stderr
    with httpx.Client(timeout=60) as c:
        for srv, tag in ((pair.a, "a5"), (pair.b, "b5")):
            _wait(lambda s=srv: _revision(c, s) == 4, 10, "revision 4 on both")
            assert _versions(c, srv, tag) == {"v1", "c"}
            assert "rolled_back" not in _admin_text(c, srv)
