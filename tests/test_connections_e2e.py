"""Connection lifecycle against a real ``servehall serve`` (Hypercorn, demo model): cases
N11, N27, N28, N29 (issue 13 §1), N32 and the HTTP/1.1 413 for clients that write before
they read (issue 16 items 4 and 5).

Raw sockets throughout (:mod:`servehall.testing.rawhttp`); socket states come from the
kernel (``/proc/net/tcp`` — what ``ss -tan`` shows), descriptor counts from
``/proc/PID/fd``. Time bounds are generous (the 1 s target is measured by
``bench/bench_connections.py``); assertions are on states, counts and responses.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import resource
import shutil
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from servehall.testing.rawhttp import H2Client, H2Stream, read_response, read_until_closed
from servehall.testing.sockets import open_fds, server_socket_states, wait_for_states
from tests.conftest import ServerHandle, demo_config, dump_toml, run_cli

PEPPER = "conn-e2e-pepper-" + uuid.uuid4().hex
PEPPER_ENV = "SERVEHALL_CONN_E2E_PEPPER"
GRACEFUL_S = 30
SETTLE_S = 10.0  # generous bound for "released within 1 s" on a loaded CI machine


def chat(max_tokens: int = 2, stream: bool = False) -> bytes:
    return json.dumps(
        {
            "model": "demo",
            "temperature": 0,
            "seed": 1,
            "max_tokens": max_tokens,
            "stream": stream,
            "messages": [{"role": "user", "content": "Hi"}],
        }
    ).encode()


def h1(port: int, raw: bytes, *, streamed: bool = False) -> bytes:
    """Send ``raw`` on a new connection, read the whole response, then close (the
    client closes first: the case of N29)."""
    with socket.create_connection(("127.0.0.1", port), timeout=60) as s:
        s.sendall(raw)
        if not streamed:
            status, _, body = read_response(s, bytearray())
            assert status == 200, body[:300]
            return body
        got = b""
        while not got.endswith(b"0\r\n\r\n"):  # the last chunk of a chunked body
            chunk = s.recv(65536)
            assert chunk, got[-300:]
            got += chunk
        assert got.startswith(b"HTTP/1.1 200") and b"data: [DONE]" in got, got[:300]
        return got


def h1_post(path: str, body: bytes, *extra: str) -> bytes:
    head = f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    head += "".join(f"{h}\r\n" for h in extra)
    return head.encode() + f"Content-Length: {len(body)}\r\n\r\n".encode() + body


def h2(port: int, method: str, path: str, body: bytes | None = None) -> H2Stream:
    with socket.create_connection(("127.0.0.1", port), timeout=60) as s:
        client = H2Client(s)
        headers = [("content-type", "application/json")] if body is not None else []
        sid = client.request(method, path, headers, body)
        assert client.wait([sid]), client.terminated
        st = client.streams[sid]
        assert st.status == 200, st.body[:300]
        return st


@pytest.fixture(scope="module")
def server(servehall_server: Callable[..., ServerHandle], demo_model_dir: Path) -> Iterator[Any]:
    cfg = demo_config(demo_model_dir, server={"graceful_timeout_s": GRACEFUL_S})
    with servehall_server(cfg, name="connections") as srv:
        yield srv


def no_open_server_sockets(states: Any) -> bool:
    return states["CLOSE-WAIT"] == 0 and states["ESTABLISHED"] == 0


# --- N29: closed connections -------------------------------------------------------------


def test_n29_closed_connections_are_released(server: Any) -> None:
    port = server.port
    baseline = open_fds(server.process.pid)
    errors: list[BaseException] = []

    def client() -> None:
        try:
            h1(port, b"GET /health/live HTTP/1.1\r\nHost: x\r\n\r\n")
            h1(port, h1_post("/v1/chat/completions", chat()))
            h1(port, h1_post("/v1/chat/completions", chat(stream=True)), streamed=True)
            h2(port, "GET", "/health/live")
            h2(port, "POST", "/v1/chat/completions", chat())
            st = h2(port, "POST", "/v1/chat/completions", chat(stream=True))
            assert st.body.endswith(b"data: [DONE]\n\n")
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=client) for _ in range(40)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not errors, errors[:3]
    ok, states = wait_for_states(port, no_open_server_sockets, timeout=SETTLE_S)
    assert ok, states  # today: 240 sockets in CLOSE-WAIT for keep_alive_timeout_s (75 s)
    assert open_fds(server.process.pid) <= baseline + 5


def test_n29_idle_keep_alive_connection_still_served(server: Any) -> None:
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as s:
        buf = bytearray()
        for _ in range(2):
            s.sendall(b"GET /health/live HTTP/1.1\r\nHost: x\r\n\r\n")
            assert read_response(s, buf)[0] == 200
            time.sleep(0.5)


# --- N11: HTTP/2 stream limit ---------------------------------------------------------------


def test_n11_stream_over_limit_refused_alone(server: Any) -> None:
    import h2.errors

    with socket.create_connection(("127.0.0.1", server.port), timeout=60) as s:
        client = H2Client(s)
        m = client.read_settings()
        client.allow_streams(m + 1)
        sids = [client.request("GET", "/health/live", flush=False) for _ in range(m + 1)]
        client.flush()  # M+1 HEADERS frames in one write
        assert client.wait(sids), f"connection ended: GOAWAY {client.terminated}"
        streams = [client.streams[i] for i in sids]
        assert sum(st.status == 200 and st.ended for st in streams) == m
        assert [st.reset for st in streams if st.reset is not None] == [
            h2.errors.ErrorCodes.REFUSED_STREAM
        ]
        again = client.request("GET", "/health/live")  # the connection stays usable
        assert client.wait([again]) and client.streams[again].status == 200


# --- N27: HTTP/1.1 early answers ------------------------------------------------------------


def early_answer(port: int, head: str) -> tuple[int, dict[str, str], bytes, int | str]:
    """Headers of a POST with an 80-byte body, 10 ms, the body, then a second request on
    the same socket. Returns the first response and the second's status (or the error)."""
    body = b"x" * 80
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(head.encode() + f"Content-Length: {len(body)}\r\n\r\n".encode())
        time.sleep(0.01)
        with contextlib.suppress(OSError):
            s.sendall(body)
        buf = bytearray()
        status, headers, payload = read_response(s, buf)
        try:
            s.sendall(b"GET /health/live HTTP/1.1\r\nHost: x\r\n\r\n")
            second: int | str = read_response(s, buf)[0]
        except OSError as exc:
            second = type(exc).__name__
        if second != 200:  # the other allowed outcome: it said close, and it closed
            assert headers.get("connection") == "close", (status, headers, second)
            assert read_until_closed(s, SETTLE_S)
        return status, headers, payload, second


def test_n27_415_body_read_and_dropped(server: Any) -> None:
    head = "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain\r\n"
    status, _, payload, second = early_answer(server.port, head)
    assert status == 415 and json.loads(payload)["error"]["type"]
    assert second == 200  # servehall reads the small body and keeps the connection


def test_n27_404_unknown_path(server: Any) -> None:
    head = "POST /v1/nothing HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    status, _, payload, second = early_answer(server.port, head)
    assert status == 404 and json.loads(payload)["error"]["code"] == "not_found"
    assert second == 200


# --- issue 16 item 5: clients that write before they read get the 413 ------------------------


async def _async_httpx_post(url: str, size: int) -> httpx.Response:
    async with httpx.AsyncClient(http1=True, http2=False, timeout=60) as c:
        return await c.post(
            url + "/v1/chat/completions",
            content=b"x" * size,
            headers={"content-type": "application/json"},
        )


def test_async_httpx_h1_sees_the_413(server: Any, tmp_path: Path) -> None:
    size = 5_000_000  # over the default max_body_bytes (4 MiB)
    for _ in range(5):
        r = asyncio.run(_async_httpx_post(server.base_url, size))
        assert r.status_code == 413 and r.http_version == "HTTP/1.1"
        assert r.json()["error"]["code"] == "payload_too_large"
    with httpx.Client(http1=True, http2=False, timeout=60) as c:
        r = c.post(
            server.base_url + "/v1/chat/completions",
            content=b"x" * size,
            headers={"content-type": "application/json"},
        )
        assert r.status_code == 413
    if shutil.which("curl"):
        f = tmp_path / "big.json"
        f.write_bytes(b"x" * size)
        curl = ["curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}", "--http1.1"]
        out = subprocess.run(
            [
                *curl,
                *("-H", "content-type: application/json", "--data-binary", f"@{f}"),
                server.base_url + "/v1/chat/completions",
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.stdout == "413", out.stderr
    ok, states = wait_for_states(server.port, no_open_server_sockets, timeout=SETTLE_S)
    assert ok, states


# --- N32: out of descriptors ---------------------------------------------------------------


def _metric(text: str, name: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name):
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_n32_out_of_descriptors(
    servehall_server: Callable[..., ServerHandle], demo_model_dir: Path
) -> None:
    cfg = demo_config(demo_model_dir, server={"auth_allow_paths": ["/health/live", "/metrics"]})
    with servehall_server(cfg, name="nofile") as srv:
        pid = srv.process.pid
        hard = resource.prlimit(pid, resource.RLIMIT_NOFILE)[1]
        resource.prlimit(pid, resource.RLIMIT_NOFILE, (1024, hard))  # ulimit -n 1024
        baseline = open_fds(pid)
        # 1,030 sequential requests, each on its own connection: all answered
        for _ in range(1030):
            h1(srv.port, b"GET /health/live HTTP/1.1\r\nHost: x\r\n\r\n")
        ok, states = wait_for_states(srv.port, no_open_server_sockets, timeout=SETTLE_S)
        assert ok, states
        assert open_fds(pid) <= baseline + 5

        # now really run out: hold more idle connections than the process has descriptors
        log_before = len(srv.log_text())
        held: list[socket.socket] = []
        try:
            deadline = time.monotonic() + 60
            peak = open_fds(pid)
            while peak < 1024 and time.monotonic() < deadline:
                for _ in range(50):
                    s = socket.socket()
                    s.setblocking(False)
                    with contextlib.suppress(BlockingIOError):
                        s.connect(("127.0.0.1", srv.port))
                    held.append(s)
                time.sleep(0.2)
                peak = max(peak, open_fds(pid))
            assert peak == 1024, peak  # every descriptor in use
            time.sleep(3.0)  # asyncio retries accept() every second: more failures
        finally:
            for s in held:
                s.close()
        log = srv.log_text()[log_before:]
        assert "Traceback" not in log
        lines = [ln for ln in log.splitlines() if "cannot accept connections" in ln]
        assert 1 <= len(lines) <= 2, log[-3000:]
        assert "EMFILE" in lines[0] and "1024 descriptors" in lines[0]
        assert len(log) < 20_000  # today: a traceback per accept() (199 MiB in a minute)

        # the server comes back by itself once the connections are gone
        ok, states = wait_for_states(srv.port, no_open_server_sockets, timeout=30)
        assert ok, states
        with httpx.Client(base_url=srv.base_url, timeout=30) as c:
            assert c.get("/health/live").status_code == 200
            metrics = c.get("/metrics").text
        assert _metric(metrics, 'servehall_accept_errors_total{reason="EMFILE"}') >= 1


# --- with auth: N27 (401) and N28 -------------------------------------------------------------


@pytest.fixture(scope="module")
def auth_server(
    servehall_server: Callable[..., ServerHandle],
    demo_model_dir: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[ServerHandle, str]]:
    work = tmp_path_factory.mktemp("conn-auth")
    cfg = demo_config(
        demo_model_dir,
        plugins={"enabled": ["auth"]},
        server={"graceful_timeout_s": GRACEFUL_S},
        database={"url": f"sqlite+aiosqlite:///{work / 'servehall.db'}"},
        auth={"pepper": {"env": PEPPER_ENV}},
    )
    config = work / "deploy.toml"
    config.write_text(dump_toml(cfg))
    env = {PEPPER_ENV: PEPPER}
    for args in (("db", "upgrade"), ("keys", "create", "--tenant", "t", "--json")):
        proc = run_cli(config, *args, env=env, cwd=work)
        assert proc.returncode == 0, proc.stdout + proc.stderr
    key = json.loads(proc.stdout)["key"]
    srv = servehall_server(config.read_text(), env=env, name="conn-auth")
    try:
        yield srv, key
    finally:
        srv.stop()


def test_n27_401_without_key(auth_server: tuple[ServerHandle, str]) -> None:
    srv, _ = auth_server
    head = "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    status, _, payload, second = early_answer(srv.port, head)
    assert status == 401 and json.loads(payload)["error"]["type"] == "authentication_error"
    assert second == 200


def test_n28_413_with_auth_closes_and_does_not_delay_shutdown(
    auth_server: tuple[ServerHandle, str],
) -> None:
    """Runs last with this server: it stops it."""
    srv, key = auth_server
    size = 20_000_000
    s = socket.create_connection(("127.0.0.1", srv.port), timeout=30)
    write_error: list[str] = []

    def writer() -> None:
        try:
            s.sendall(
                f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                f"Authorization: Bearer {key}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {size}\r\n\r\n".encode()
            )
            s.sendall(b'{"model": "demo", "messages": [')
            left = size - 31
            while left > 0:
                n = min(left, 65_536)
                s.sendall(b" " * n)
                left -= n
        except OSError as exc:
            write_error.append(type(exc).__name__)

    t = threading.Thread(target=writer, daemon=True)
    t.start()
    try:
        status, headers, payload = read_response(s, bytearray())
        assert status == 413, payload[:300]
        assert json.loads(payload)["error"]["code"] == "payload_too_large"
        assert headers.get("connection") == "close"
        assert read_until_closed(s, SETTLE_S)  # closed after the 413 (or the dropped body)
    finally:
        t.join(60)
        s.close()
    ok, states = wait_for_states(srv.port, lambda st: st["ESTABLISHED"] == 0, timeout=SETTLE_S)
    assert ok, states  # today: ESTABLISHED with unread data until SIGTERM's timeout
    assert server_socket_states(srv.port)["CLOSE-WAIT"] == 0
    sigterm_at = time.time()
    srv.stop(timeout=GRACEFUL_S + 30)
    assert srv.process.returncode == 0
    # from SIGTERM to the server's "servehall stopped" (the interpreter's own exit after
    # that is not the connection's doing)
    stopped = [ln for ln in srv.log_text().splitlines() if "servehall stopped" in ln]
    assert stopped, srv.log_text()[-2000:]
    stamp = datetime.strptime(stopped[-1][:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
    assert stamp - sigterm_at < GRACEFUL_S / 2, stamp - sigterm_at  # not held by the socket
