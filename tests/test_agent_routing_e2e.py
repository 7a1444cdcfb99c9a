"""Load-aware routing end to end: two real ``servehall serve`` replicas (demo model,
``[server] agent_bind``, ``[scheduler] max_concurrency = 2``) behind the real HAProxy with
``deploy/haproxy.cfg`` as is (``agent-check``, ``agent-inter 1s``); which replica answered
is HAProxy's ``x-servehall-backend`` response header.

Replica A is made slow by real load, not a fault: sixteen long streamed completions
(``ignore_eos``, 1,900 tokens) sent to A directly fill its two slots and queue fourteen
more, so A's agent answers ``up ready 1%`` (B, idle, ``100%``). (On a fast machine the
demo model streams two requests of 1,900 tokens in under two seconds: a queue of one
empties before the 30 requests below are sent; seven more pairs keep A full for several
seconds.) Then:

1. every request sent through HAProxy from 2 s after A is full goes to B (at most one
   of 30 to A: HAProxy's weighted round robin still gives a 1 % server one pick in ~101);
   A's endpoint-picker gauges show the load meanwhile;
2. the streams closed (the client disconnects abort them), A is idle again and from 2 s
   later requests go to both replicas again;
3. A drains (SIGTERM, one long request still running so the drain lasts): every request
   sent through HAProxy is answered by B, none fails.

One topology per module (two server starts, one HAProxy).
"""

from __future__ import annotations

import concurrent.futures
import re
import signal
import socket
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.conftest import (
    ServerHandle,
    demo_config,
    free_port,
    haproxy_binary,
    hold_stream,
    run_haproxy,
)
from tests.test_worker_e2e import STREAM as LONG  # 1,900 tokens, ignore_eos

SHORT = {"model": "demo", "prompt": "Hi", "max_tokens": 1, "temperature": 0}


@dataclass
class Pair:
    a: ServerHandle
    b: ServerHandle
    url: str  # HAProxy


@pytest.fixture(scope="module")
def pair(
    servehall_server: Callable[..., ServerHandle],
    demo_model_dir: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Pair]:
    binary = haproxy_binary()
    if binary is None:
        pytest.skip("haproxy not installed (.ci/services.d/haproxy.sh)")
    agents = {"a": free_port(), "b": free_port()}

    def start(name: str) -> ServerHandle:
        cfg = demo_config(
            demo_model_dir,
            server={"agent_bind": f"127.0.0.1:{agents[name]}", "graceful_timeout_s": 60},
            scheduler={"max_concurrency": 2},
        )
        return servehall_server(cfg, name=f"replica-{name}", ready_timeout=600)

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        fa, fb = pool.submit(start, "a"), pool.submit(start, "b")
        a, b = fa.result(), fb.result()
    log = tmp_path_factory.mktemp("haproxy") / "haproxy.log"
    try:
        with run_haproxy(
            binary, f"127.0.0.1:{a.port}", f"127.0.0.1:{b.port}", agents["a"], agents["b"], log
        ) as url:
            yield Pair(a, b, url)
    finally:
        a.stop()
        b.stop()


def _gauge(srv: ServerHandle, name: str) -> float:
    text = httpx.get(srv.base_url + "/metrics", timeout=30).text
    m = re.search(rf"^{name} (\S+)$", text, re.M)
    assert m, name
    return float(m.group(1))


def _until(check: Callable[[], bool], timeout: float, what: str) -> float:
    """Poll ``check`` every 50 ms; the monotonic time it first held."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)
    return time.monotonic()


def _send(url: str, n: int, timeout: float = 30.0) -> Counter[str]:
    """``n`` sequential short requests through HAProxy; who answered each (``timeout``
    for one that waited past ``timeout``: it sat in a full replica's queue)."""
    got: Counter[str] = Counter()
    with httpx.Client(base_url=url, timeout=timeout) as c:
        for _ in range(n):
            try:
                r = c.post("/v1/completions", json=SHORT)
            except httpx.TimeoutException:
                got["timeout"] += 1
                continue
            assert r.status_code == 200, r.text
            got[r.headers["x-servehall-backend"]] += 1
    return got


def test_requests_follow_the_agents_away_from_a_loaded_replica_and_back(pair: Pair) -> None:
    before = _send(pair.url, 20)
    assert before["a"] >= 5 and before["b"] >= 5, before  # both take work when idle
    flood: list[socket.socket] = []
    try:
        for i in range(16):  # two take A's slots, the others wait (no first event yet)
            flood.append(hold_stream(pair.a.port, LONG, first_event=i < 2)[0])
        full = _until(
            lambda: (
                _gauge(pair.a, "servehall_replica_requests_running") == 2
                and _gauge(pair.a, "servehall_replica_requests_waiting") >= 1
            ),
            60,
            "replica A never had 2 running and 1 waiting",
        )
        # the KV-cache figure comes with the worker's next heartbeat (every 0.1 s), which
        # may follow the admission gauges read above
        _until(
            lambda: _gauge(pair.a, "servehall_replica_kv_cache_usage_ratio") > 0,
            5,
            "replica A's KV-cache usage stayed 0 with 2 long streams running",
        )
        time.sleep(max(0.0, full + 2.0 - time.monotonic()))
        loaded = _send(pair.url, 30, timeout=20)
        # a request that went to A waits for a slot (and times out here): count it as A's
        assert loaded["a"] + loaded["timeout"] <= 1 and loaded["b"] >= 29, loaded
        assert _gauge(pair.b, "servehall_replica_requests_waiting") == 0
    finally:
        for s in flood:
            s.close()  # client disconnect: A aborts the long requests
    idle = _until(
        lambda: (
            _gauge(pair.a, "servehall_replica_requests_running") == 0
            and _gauge(pair.a, "servehall_replica_requests_waiting") == 0
        ),
        60,
        "replica A did not go idle after the streams were closed",
    )
    time.sleep(max(0.0, idle + 2.0 - time.monotonic()))
    after = _send(pair.url, 30)
    assert after["a"] >= 8 and after["b"] >= 8, after


def test_a_draining_replica_gets_no_new_request(pair: Pair) -> None:
    held, _ = hold_stream(pair.a.port, LONG)  # keeps A draining for a while
    try:
        pair.a.process.send_signal(signal.SIGTERM)
        time.sleep(0.2)
        assert pair.a.process.poll() is None  # still draining the long request
        got = _send(pair.url, 20)
        assert got == Counter({"b": 20}), got
        assert pair.a.process.poll() is None, "A finished draining before the check ended"
    finally:
        held.close()
    assert pair.a.process.wait(60) == 0
