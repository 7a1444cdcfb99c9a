"""deploy/haproxy.cfg with HAProxy's agent check, verified against a real HAProxy: new
requests follow the weights the agents answer within 2 s, a ``drain`` answer gets a
server no new request, and an agent that stops answering leaves its last weight in place
(HAProxy's documented behaviour — checked here, not assumed).

The two backends are small HTTP servers standing in for replicas and the agents answer
lines the test sets (what a servehall agent answers for a given load is tested in
core/tests/server/test_agent.py); HAProxy and its configuration are the real ones.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections import Counter
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from tests.conftest import haproxy_binary, run_haproxy


def _backend(name: str) -> ThreadingHTTPServer:
    class H(BaseHTTPRequestHandler):
        def _answer(self) -> None:
            body = name.encode()
            self.send_response(200)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = _answer
        do_POST = _answer

        def log_message(self, *args: object) -> None:
            pass

    class Quiet(ThreadingHTTPServer):
        def handle_error(self, request: object, client_address: object) -> None:
            pass  # HAProxy's health checks close before reading the answer

    srv = Quiet(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


class Agent:
    """A TCP agent answering ``self.line`` to each connection; ``stop()`` closes it."""

    def __init__(self) -> None:
        self.line = "up ready 100%"
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.asked = 0
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                self.asked += 1
                conn.sendall(self.line.encode() + b"\n")

    def stop(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept() (Linux)
        self.sock.close()


@pytest.fixture(scope="module")
def lb(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Agent, Agent]]:
    binary = haproxy_binary()
    if binary is None:
        pytest.skip("haproxy not installed (.ci/services.d/haproxy.sh)")
    a, b = _backend("a"), _backend("b")
    agent_a, agent_b = Agent(), Agent()
    log_path = Path(tmp_path_factory.mktemp("haproxy")) / "haproxy.log"
    try:
        with run_haproxy(
            binary,
            f"127.0.0.1:{a.server_address[1]}",
            f"127.0.0.1:{b.server_address[1]}",
            agent_a.port,
            agent_b.port,
            log_path,
        ) as url:
            deadline = time.monotonic() + 30
            while _served_by(url) != {"a", "b"}:  # both up (health checks passed)
                assert time.monotonic() < deadline, log_path.read_text()
                time.sleep(0.3)
            yield url, agent_a, agent_b
    finally:
        agent_a.stop()
        agent_b.stop()
        a.shutdown()
        b.shutdown()


def _served_by(url: str) -> set[str]:
    """Which backends answered 20 requests; empty while HAProxy is not listening yet."""
    try:
        return set(_shares(url, 20))
    except httpx.TransportError:  # started but not bound yet (a loaded machine)
        return set()


def _shares(url: str, n: int) -> Counter[str]:
    with httpx.Client(base_url=url, timeout=10) as c:
        return Counter(c.post("/v1/completions").text for _ in range(n))


def _within(seconds: float, url: str, ok: object) -> Counter[str]:
    """Send batches of 40 until ``ok(counts)`` holds (or ``seconds`` pass); the last."""
    deadline = time.monotonic() + seconds
    while True:
        got = _shares(url, 40)
        if ok(got) or time.monotonic() > deadline:  # type: ignore[operator]
            return got


def test_requests_follow_agent_weights_drain_and_a_silent_agent(
    lb: tuple[str, Agent, Agent],
) -> None:
    url, agent_a, _agent_b = lb
    # a loaded (weight 1 %), b idle: new requests move to b within 2 s (agent-inter 1 s)
    agent_a.line = "up ready 1%"
    t = time.monotonic()
    got = _within(5, url, lambda c: c["a"] == 0)
    assert got["a"] == 0 and got["b"] == 40, got
    assert time.monotonic() - t <= 2.5  # one agent interval plus the batch itself
    # back to equal weights: both serve again
    agent_a.line = "up ready 100%"
    got = _within(5, url, lambda c: c["a"] >= 10 and c["b"] >= 10)
    assert got["a"] >= 10 and got["b"] >= 10, got
    # a draining replica gets no new request
    agent_a.line = "drain"
    got = _within(5, url, lambda c: c["a"] == 0)
    assert got["a"] == 0, got
    time.sleep(1.5)
    assert _shares(url, 40)["a"] == 0
    # ready again, then its agent answers 25 % and goes silent: HAProxy keeps 25 %
    agent_a.line = "up ready 25%"
    got = _within(5, url, lambda c: 3 <= c["a"] <= 14)
    agent_a.stop()
    time.sleep(0.2)
    asked = agent_a.asked
    time.sleep(3)  # three agent intervals without an answer
    assert agent_a.asked == asked
    got = _shares(url, 100)
    assert 10 <= got["a"] <= 35, got  # 25/(25+100) = 20 % of requests, not 0 % or 50 %
