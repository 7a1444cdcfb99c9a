"""``[server] api_processes = 2`` end to end (issue 38, item 1): ONE real ``servehall
serve`` with two HTTP frontend processes, the auth plugin, SQLite records and the
``null`` engine (paced, so streams last long enough to be cut or drained), driven over
HTTP/2 with httpx and the official ``openai`` client.

Which frontend served a connection is read from the kernel: the frontends are the serve
process's children running ``servehall.server.frontend``, and the one holding the
server end of the client's TCP connection (psutil) is the one that served it.

The tests share the server and run in order: the kill test restarts a frontend, the
SIGTERM test (last) stops the server.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import signal
import sqlite3
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from tests.conftest import (
    ServerHandle,
    create_keys,
    demo_config,
    dump_toml,
    run_cli,
    start_server,
)

PEPPER = "ap-e2e-pepper-" + uuid.uuid4().hex
PEPPER_ENV = "SERVEHALL_E2E_AP_PEPPER"
MAX_CONCURRENCY, MAX_QUEUE = 6, 2
TOKENS_PER_S = 100
SHORT: dict[str, Any] = {
    "model": "demo",
    "prompt": "Hello there",
    "max_tokens": 4,
    "temperature": 0,
}
CHAT: dict[str, Any] = {
    "model": "demo",
    "messages": [{"role": "user", "content": "Hi"}],
    "max_tokens": 4,
}


def stream_body(tokens: int) -> dict[str, Any]:
    """A streamed completion of ``tokens`` tokens (``tokens / TOKENS_PER_S`` seconds)."""
    return {
        "model": "demo",
        "prompt": "ABCDEFGH " * 30,
        "max_tokens": tokens,
        "stream": True,
        "ignore_eos": True,
        "temperature": 0,
    }


class Deployment:
    def __init__(self, server: ServerHandle, db: Path, keys: dict[str, str], config: Path):
        self.server = server
        self.db = db
        self.keys = keys
        self.config = config
        self.url = f"sqlite+aiosqlite:///{db}"

    def headers(self, who: str = "a") -> dict[str, str]:
        return {"Authorization": f"Bearer {self.keys[who]}"}

    def frontends(self) -> list[int]:
        """The frontend processes' pids (children of the serve process)."""
        out = []
        for child in psutil.Process(self.server.process.pid).children():
            try:
                if "servehall.server.frontend" in " ".join(child.cmdline()):
                    out.append(child.pid)
            except psutil.NoSuchProcess:
                pass
        return sorted(out)

    def served_by(self, client_port: int) -> int:
        """The frontend holding the server end of the connection from ``client_port``."""
        for pid in self.frontends():
            for c in psutil.Process(pid).net_connections("tcp"):
                if c.raddr and c.raddr.port == client_port and c.laddr.port == self.server.port:
                    return pid
        raise AssertionError(f"no frontend holds the connection from port {client_port}")

    def _options(self, who: str) -> dict[str, Any]:
        """An HTTP/2-only client's options with ``who``'s key."""
        url = self.server.base_url
        return {"base_url": url, "http1": False, "http2": True, "timeout": 60} | {
            "headers": self.headers(who)
        }

    def client(self, who: str = "a") -> httpx.Client:
        return httpx.Client(**self._options(who))

    def aclient(self, who: str = "a") -> httpx.AsyncClient:
        return httpx.AsyncClient(**self._options(who))

    def rows(self, sql: str, *args: Any) -> list[Any]:
        with sqlite3.connect(self.db) as db:
            return db.execute(sql, args).fetchall()

    def wait_request_rows(self, ids: list[str], timeout: float = 30.0) -> dict[str, tuple]:
        """``{request_id: (status_code, finish_reason)}`` once every id has its row."""
        marks = ",".join("?" * len(ids))
        sql = "SELECT request_id, status_code, finish_reason FROM request_log"
        sql += f" WHERE request_id IN ({marks})"
        deadline = time.monotonic() + timeout
        while True:
            rows = self.rows(sql, *ids)
            if len(rows) >= len(ids) or time.monotonic() > deadline:
                return {r[0]: (r[1], r[2]) for r in rows}
            time.sleep(0.1)


def _port(response: httpx.Response) -> int:
    """The client's local port of the connection that carried ``response``."""
    return int(response.extensions["network_stream"].get_extra_info("client_addr")[1])


def clients_on_both(d: Deployment, who: str, per: int) -> list[tuple[httpx.Client, int]]:
    """``per`` open HTTP/2 connections to each frontend, interleaved: ``(client, pid)``.
    (New connections are probed with ``/health/ready`` until each frontend holds
    ``per``: a burst of connections may all go to one.)"""
    kept: dict[int, list[httpx.Client]] = {}
    for _ in range(200):
        c = d.client(who)
        with c.stream("GET", "/health/ready") as r:
            r.read()
            pid = d.served_by(_port(r))
        if len(kept.setdefault(pid, [])) < per:
            kept[pid].append(c)
        else:
            c.close()
        if len(kept) == 2 and all(len(v) == per for v in kept.values()):
            a, b = kept.values()
            pa, pb = kept
            return [x for pair in zip(a, b, strict=True) for x in ((pair[0], pa), (pair[1], pb))]
    raise AssertionError(f"connections went to {[(p, len(v)) for p, v in kept.items()]} only")


async def aclients_on_both(
    d: Deployment, who: str, per: int
) -> list[tuple[httpx.AsyncClient, int]]:
    """:func:`clients_on_both` with async clients."""
    kept: dict[int, list[httpx.AsyncClient]] = {}
    for _ in range(200):
        c = d.aclient(who)
        async with c.stream("GET", "/health/ready") as r:
            await r.aread()
            pid = d.served_by(_port(r))
        if len(kept.setdefault(pid, [])) < per:
            kept[pid].append(c)
        else:
            await c.aclose()
        if len(kept) == 2 and all(len(v) == per for v in kept.values()):
            return [(c, pid) for pid, cs in kept.items() for c in cs]
    raise AssertionError(f"connections went to {[(p, len(v)) for p, v in kept.items()]} only")


@pytest.fixture(scope="module")
def d(demo_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    work = tmp_path_factory.mktemp("api-processes")
    db = work / "servehall.db"
    cfg = demo_config(
        demo_model_dir,
        plugins={"enabled": ["auth"]},
        database={"url": f"sqlite+aiosqlite:///{db}", "auto_migrate": True},
        sinks=[{"name": "sql", "options": {"linger_s": 0.01}}],
        auth={"pepper": {"env": PEPPER_ENV}, "key_cache_ttl_s": 0},
        server={"api_processes": 2, "graceful_timeout_s": 30},
        scheduler={"max_concurrency": MAX_CONCURRENCY, "max_queue": MAX_QUEUE},
    )
    model = cfg["models"][0]
    model["backend"] = "null"
    model["options"] = {"tokens_per_s": TOKENS_PER_S, "max_num_seqs": 64}
    model["tool_call_grammar"] = "strict"  # the null engine compiles no grammar
    config = work / "deploy.toml"
    config.write_text(dump_toml(cfg))
    env = {PEPPER_ENV: PEPPER}

    def cli(*args: str) -> str:
        proc = run_cli(config, *args, env=env, cwd=work)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return proc.stdout

    cli("db", "upgrade")
    keys = create_keys(cli, ops=("admin,inference",))
    server = start_server(config.read_text(), work, env=env, name="ap2")
    try:
        dep = Deployment(server, db, keys, config)
        for who, extra in (("a", {}), ("limited", {"rpm": 6})):  # through the admin API
            with dep.client("ops") as c:
                r = c.post("/admin/keys", json={"tenant": f"team-{who}", **extra})
                assert r.status_code == 201, r.text
                keys[who] = r.json()["key"]
        yield dep
    finally:
        server.stop()


def test_requests_land_on_both_frontends_and_every_answer_is_recorded(d: Deployment) -> None:
    import openai

    frontends = d.frontends()
    assert len(frontends) == 2, frontends
    assert "with 2 API processes" in d.server.log_text()
    seen: dict[int, int] = {}
    ids: list[str] = []
    for i in range(40):  # separate connections: the kernel hands each to one frontend
        with d.client() as c:
            if i % 2:
                r = c.post("/v1/completions", json=SHORT)
                assert r.status_code == 200, r.text
                assert r.json()["usage"]["completion_tokens"] == 4
                port = _port(r)
            else:
                with c.stream("POST", "/v1/completions", json=stream_body(5)) as r:
                    assert r.status_code == 200
                    port = _port(r)
                    events = [x for x in r.iter_lines() if x.startswith("data: ")]
                # (the paced engine may put several tokens in one event when behind)
                assert events[-1] == "data: [DONE]" and len(events) >= 2, events
            ids.append(r.headers["x-request-id"])
            pid = d.served_by(port)
            seen[pid] = seen.get(pid, 0) + 1
        if len(seen) == 2 and len(ids) >= 8:
            break
    assert set(seen) == set(frontends), seen

    client = openai.OpenAI(base_url=d.server.base_url + "/v1", api_key=d.keys["a"], max_retries=0)
    for _ in range(3):
        chat = client.chat.completions.with_raw_response.create(**CHAT)
        ids.append(chat.headers["x-request-id"])
        assert chat.parse().choices[0].message.content
        with client.chat.completions.with_streaming_response.create(**CHAT, stream=True) as s:
            ids.append(s.headers["x-request-id"])
            chunks = list(s.parse())
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)

    rows = d.wait_request_rows(ids)
    assert len(rows) == len(ids) == len(set(ids))  # one row per answered request
    assert {v[0] for v in rows.values()} == {200}


def _metric(text: str, name: str, labels: str = "") -> float:
    """The sum of ``name``'s samples whose labels contain ``labels``."""
    total = 0.0
    for m in re.finditer(rf"^{name}(\{{[^}}]*\}})? (\S+)$", text, re.M):
        if labels in (m.group(1) or ""):
            total += float(m.group(2))
    return total


def _per_frontend(d: Deployment, path: str, who: str = "a") -> dict[int, httpx.Response]:
    """``path`` fetched over new connections until each frontend has answered once."""
    got: dict[int, httpx.Response] = {}
    for _ in range(60):
        with d.client(who) as c, c.stream("GET", path) as r:
            r.read()
            got.setdefault(d.served_by(_port(r)), r)
        if len(got) == 2:
            return got
    raise AssertionError(f"only {list(got)} answered {path}")


def test_metrics_are_one_set_and_ready_is_truthful_from_every_frontend(d: Deployment) -> None:
    metrics = _per_frontend(d, "/metrics")
    texts = [r.text for r in metrics.values()]
    for name in ("servehall_requests_total", "servehall_generation_tokens_total"):
        values = [_metric(t, name) for t in texts]
        assert values[0] == values[1] and values[0] > 0, (name, values)
    assert _metric(texts[0], "servehall_api_process_restarts_total") == 0
    ready = _per_frontend(d, "/health/ready")
    for r in ready.values():
        assert r.status_code == 200
        body = r.json()
        assert body["status"] == "ready" and body["models"]["demo"]["state"] == "serving"
    hashes = {r.json()["config"]["hash"] for r in ready.values()}
    assert len(hashes) == 1


def test_a_keys_rate_limit_is_counted_once_over_both_frontends(d: Deployment) -> None:
    clients = clients_on_both(d, "limited", 4)
    codes: list[int] = []
    frontends: list[int] = []
    try:
        for c, pid in clients[:7]:  # 6 per minute allowed; alternating frontends
            r = c.post("/v1/completions", json=SHORT)
            codes.append(r.status_code)
            frontends.append(pid)
    finally:
        for c, _ in clients:
            c.close()
    assert codes == [200] * 6 + [429], codes
    assert len(set(frontends)) == 2


def test_admission_is_global_over_both_frontends(d: Deployment) -> None:
    """``max_concurrency`` + ``max_queue`` streams held over connections of both
    frontends fill the model; one more request is refused (queue full) whichever
    frontend takes it; the queue and slots are one (``/health/ready``)."""

    async def scenario() -> None:
        used: set[int] = set()

        async def hold() -> None:
            async with (
                d.aclient() as c,
                c.stream("POST", "/v1/completions", json=stream_body(1500)) as r,
            ):
                used.add(d.served_by(_port(r)))
                async for _ in r.aiter_lines():
                    pass

        holders = [asyncio.ensure_future(hold()) for _ in range(MAX_CONCURRENCY + MAX_QUEUE)]
        try:
            deadline = time.monotonic() + 30
            while True:
                sched = httpx.get(d.server.base_url + "/health/ready", timeout=10).json()
                sched = sched["models"]["demo"]["scheduler"]
                if (sched["running"], sched["waiting"]) == (MAX_CONCURRENCY, MAX_QUEUE):
                    break
                assert time.monotonic() < deadline, sched
                await asyncio.sleep(0.05)
            refused: dict[int, int] = {}
            for _ in range(40):
                async with d.aclient() as c, c.stream("POST", "/v1/completions", json=SHORT) as r:
                    await r.aread()
                    refused[d.served_by(_port(r))] = r.status_code
                if len(refused) == 2:
                    break
            assert set(refused.values()) == {503}, refused
            # both frontends refuse, whichever of them carries the holders (a burst of
            # connections often lands on one: the first awake takes every pending accept)
            assert len(refused) == 2 and used, (refused, used)
        finally:
            for task in holders:
                task.cancel()
            await asyncio.gather(*holders, return_exceptions=True)

    asyncio.run(scenario())
    deadline = time.monotonic() + 30
    while True:  # the cut streams free their slots
        sched = httpx.get(d.server.base_url + "/health/ready", timeout=10).json()
        if sched["models"]["demo"]["scheduler"]["running"] == 0:
            break
        assert time.monotonic() < deadline, sched
        time.sleep(0.05)


def test_admin_writes_through_both_frontends_keep_one_audit_chain(d: Deployment) -> None:
    used: set[int] = set()
    for i in range(40):
        with d.client("ops") as c:
            r = c.post("/admin/keys", json={"tenant": f"t{i}", "name": f"k{i}"})
            assert r.status_code == 201, r.text
            used.add(d.served_by(_port(r)))
        if len(used) == 2 and i >= 3:
            break
    assert len(used) == 2
    deadline = time.monotonic() + 30
    while d.rows("SELECT count(*) FROM audit_event WHERE action = 'key.created'")[0][0] < i + 3:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    ok = run_cli(d.config, "audit", "verify", env={PEPPER_ENV: PEPPER})
    assert ok.returncode == 0, ok.stdout + ok.stderr


def test_a_killed_frontend_is_restarted_while_the_others_streams_finish(d: Deployment) -> None:
    before = d.frontends()

    async def scenario() -> tuple[dict[str, str], int, list[str]]:
        """Streams on both frontends; one frontend SIGKILLed after their first token.
        Returns ``{request_id: "done" | "cut"}``, the victim's pid and its ids."""
        ctxs: list[Any] = []
        streams: list[tuple[httpx.Response, int]] = []
        clients = await aclients_on_both(d, "a", MAX_CONCURRENCY // 2)
        try:
            for c, pid in clients:
                ctx = c.stream("POST", "/v1/completions", json=stream_body(300))
                r = await ctx.__aenter__()
                ctxs.append(ctx)
                assert r.status_code == 200
                streams.append((r, pid))
            victim = streams[0][1]
            lines = [r.aiter_lines() for r, _ in streams]
            for it in lines:  # everyone has its first token
                while not (await it.__anext__()).startswith("data: "):
                    pass
            psutil.Process(victim).send_signal(signal.SIGKILL)

            async def finish(it: Any) -> str:
                last = ""
                try:
                    async for line in it:
                        if line.startswith("data: "):
                            last = line
                except (httpx.RemoteProtocolError, httpx.ReadError):
                    return "cut"
                return "done" if last == "data: [DONE]" else "cut"

            outcome = await asyncio.gather(*(finish(it) for it in lines))
            result = {
                r.headers["x-request-id"]: o for (r, _), o in zip(streams, outcome, strict=True)
            }
            victims = [r.headers["x-request-id"] for r, p in streams if p == victim]
            return result, victim, victims
        finally:
            for ctx in ctxs:
                with contextlib.suppress(httpx.HTTPError):
                    await ctx.__aexit__(None, None, None)
            for c, _ in clients:
                await c.aclose()

    result, victim, victims = asyncio.run(scenario())
    assert all(result[i] == "cut" for i in victims), result
    survivors = [i for i in result if i not in victims]
    assert survivors and all(result[i] == "done" for i in survivors), result

    deadline = time.monotonic() + 30
    while True:  # started again: a new pid beside the survivor
        now = d.frontends()
        if len(now) == 2 and victim not in now:
            break
        assert time.monotonic() < deadline, now
        time.sleep(0.1)
    assert set(now) - {victim} >= set(before) - {victim}
    with d.client() as c:
        text = c.get("/metrics").text
    assert _metric(text, "servehall_api_process_restarts_total") == 1
    # a connection to the restarted frontend is served
    assert set(_per_frontend(d, "/health/ready")) == set(now)

    rows = d.wait_request_rows(list(result))
    assert len(rows) == len(result)
    for rid in survivors:
        assert rows[rid] == (200, "length"), rows[rid]
    for rid in victims:
        assert rows[rid] == (499, "client_disconnect"), rows[rid]
    assert d.rows(
        "SELECT count(*) FROM request_log WHERE status_code >= 500 AND status_code <> 503"
    ) == [(0,)]


def test_sigterm_drains_a_stream_in_flight_then_everything_exits(d: Deployment) -> None:
    frontends = [psutil.Process(p) for p in d.frontends()]
    worker_children = psutil.Process(d.server.process.pid).children(recursive=True)
    # HTTP/1.1: httpcore fails every HTTP/2 stream when a GOAWAY arrives, even one the
    # server goes on serving (Hypercorn's graceful shutdown sends GOAWAY first)
    client = httpx.Client(base_url=d.server.base_url, timeout=60, headers=d.headers())
    with client as c, c.stream("POST", "/v1/completions", json=stream_body(200)) as r:
        lines = r.iter_lines()
        while not next(lines).startswith("data: "):
            pass
        rid = r.headers["x-request-id"]
        d.server.process.send_signal(signal.SIGTERM)
        events = [x for x in lines if x.startswith("data: ")]
    assert events[-1] == "data: [DONE]", events[-2:]
    assert d.server.process.wait(60) == 0
    # the frontends and the engine worker (and multiprocessing's resource tracker, which
    # leaves once the serve process has) are gone
    _, alive = psutil.wait_procs([*frontends, *worker_children], timeout=15)
    assert not alive, [(p.pid, p.cmdline()[:3]) for p in alive]
    assert d.wait_request_rows([rid])[rid] == (200, "length")
    ok = run_cli(d.config, "audit", "verify", env={PEPPER_ENV: PEPPER})
    assert ok.returncode == 0, ok.stdout + ok.stderr
