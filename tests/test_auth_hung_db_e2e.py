"""The auth plugin on a real server whose PostgreSQL hangs (a private cluster stopped
with SIGSTOP: it accepts connections and answers nothing): once the key cache has
expired, authenticated requests fail closed — 503 ``auth_unavailable`` in the OpenAI
envelope with ``Retry-After`` — within ``[database] command_timeout_s``, concurrent ones
too; after SIGCONT they are served again. Keys are made with the real CLI."""

from __future__ import annotations

import concurrent.futures
import json
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from servehall.db.testing import PgCluster, private_cluster
from tests.conftest import ServerHandle, dump_toml, run_cli

pytestmark = [pytest.mark.postgres]

PEPPER_ENV = "SERVEHALL_E2E_HUNG_PEPPER"
PEPPER = "e2e-hung-pepper-" + uuid.uuid4().hex
COMMAND_TIMEOUT_S = 2.0
KEY_CACHE_TTL_S = 1.0
SLACK_S = 1.0  # the event loop, HTTP/2 and a loaded machine, on top of the timeout

BODY = {
    "model": "demo",
    "temperature": 0,
    "max_tokens": 1,
    "messages": [{"role": "user", "content": "Hi"}],
}


@pytest.fixture(scope="module")
def cluster() -> Iterator[PgCluster]:
    yield from private_cluster(migrate=False)


@pytest.fixture(scope="module")
def deployment(
    cluster: PgCluster,
    servehall_server: Callable[..., ServerHandle],
    demo_model_dir: Path,
    demo_config_factory: Callable[..., dict[str, Any]],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[ServerHandle, str]]:
    work = tmp_path_factory.mktemp("auth-hung-db")
    cfg = demo_config_factory(
        demo_model_dir,
        plugins={"enabled": ["auth"]},
        database={"url": cluster.url, "command_timeout_s": COMMAND_TIMEOUT_S},
        sinks=[{"name": "sql"}],
        auth={"pepper": {"env": PEPPER_ENV}, "key_cache_ttl_s": KEY_CACHE_TTL_S},
    )
    config = work / "deploy.toml"
    config.write_text(dump_toml(cfg))
    for args in (("db", "upgrade"), ("keys", "create", "--tenant", "t", "--json")):
        done = run_cli(config, *args, env={PEPPER_ENV: PEPPER}, cwd=work)
        assert done.returncode == 0, done.stdout + done.stderr
    key = json.loads(done.stdout)["key"]
    with servehall_server(config.read_text(), env={PEPPER_ENV: PEPPER}, name="auth-hung") as srv:
        yield srv, key
    cluster.resume()


def _post(base_url: str, key: str) -> tuple[httpx.Response, float]:
    with httpx.Client(base_url=base_url, http1=False, http2=True, timeout=120) as c:
        t0 = time.monotonic()
        r = c.post("/v1/chat/completions", json=BODY, headers={"Authorization": f"Bearer {key}"})
        return r, time.monotonic() - t0


def _assert_auth_unavailable(r: httpx.Response) -> None:
    assert r.status_code == 503, (r.status_code, r.text)
    err = r.json()["error"]
    assert set(err) >= {"message", "type", "param", "code"}
    assert err["code"] == "auth_unavailable"
    assert r.headers["retry-after"] == "1"
    assert "Traceback" not in r.text


def test_a_hung_database_fails_authenticated_requests_closed_and_recovers(
    cluster: PgCluster, deployment: tuple[ServerHandle, str]
) -> None:
    srv, key = deployment
    r, _ = _post(srv.base_url, key)
    assert r.status_code == 200, r.text
    cluster.pause()
    try:
        t0 = time.monotonic()
        statuses: list[int] = []
        while time.monotonic() - t0 < 30:
            r, took = _post(srv.base_url, key)
            statuses.append(r.status_code)
            if r.status_code != 200:
                break
            assert took < COMMAND_TIMEOUT_S + SLACK_S, took
            time.sleep(0.1)
        _assert_auth_unavailable(r)
        assert took < COMMAND_TIMEOUT_S + SLACK_S, took
        # served from the key cache until it expired, then refused
        since_pause = time.monotonic() - t0
        assert since_pause < KEY_CACHE_TTL_S + COMMAND_TIMEOUT_S + SLACK_S + 0.5, since_pause
        # more concurrent requests than the key store's pool holds (4 + 4): each one is
        # refused within the timeout, none waits in the pool behind the others
        with concurrent.futures.ThreadPoolExecutor(12) as pool:
            got = list(pool.map(lambda _: _post(srv.base_url, key), range(12)))
        for resp, took in got:
            _assert_auth_unavailable(resp)
            assert took < COMMAND_TIMEOUT_S + SLACK_S, took
    finally:
        cluster.resume()
    deadline = time.monotonic() + 30
    while True:
        r, _ = _post(srv.base_url, key)
        if r.status_code == 200 or time.monotonic() > deadline:
            break
        _assert_auth_unavailable(r)
        time.sleep(0.2)
    assert r.status_code == 200, r.text
    assert srv.alive() and "Traceback" not in srv.log_text()
