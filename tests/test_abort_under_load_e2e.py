"""C19L: abort on disconnect holds under CPU load.

Two CPU burners (``while True: pass``) run beside a real server on the demo model; 20
times, two concurrent streamed completions (``max_tokens`` 1000) are closed right after
their first SSE event — over raw HTTP/1.1 sockets and over h2c connections — while
another client keeps sending short requests. Every closed stream must end with one
``request_log`` row 499 ``client_disconnect`` and fewer than ``max_tokens`` generated,
the abort counter must rise by exactly the number of closed streams, the short requests
must all be answered, and the server log must not gain a line per failed write.
"""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import h2.config
import h2.connection
import h2.events
import httpx
import pytest

from servehall.db.testing import wait_rows
from tests.conftest import sql_records, stream_then_drop

MAX_TOKENS = 1900  # near the 2,048-token context: an abort that lands late still ends early
BODY = {
    "model": "demo",
    "prompt": "ABCDEFGH ABCDEFGH ABC",
    "temperature": 0,
    "max_tokens": MAX_TOKENS,
    "stream": True,
    "ignore_eos": True,  # the length must not depend on the demo weights (they vary by CPU)
}


def h2_stream_then_drop(port: int, body: dict[str, Any]) -> None:
    """POST ``body`` on a fresh h2c connection, read until the first SSE event, close."""
    data = json.dumps(body).encode()
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    conn.initiate_connection()
    conn.send_headers(
        1,
        [
            (":method", "POST"),
            (":path", "/v1/completions"),
            (":scheme", "http"),
            (":authority", "127.0.0.1"),
            ("content-type", "application/json"),
            ("content-length", str(len(data))),
        ],
    )
    conn.send_data(1, data, end_stream=True)
    with socket.create_connection(("127.0.0.1", port), timeout=60) as s:
        s.sendall(conn.data_to_send())
        while True:
            chunk = s.recv(65536)
            assert chunk, "connection closed before the first event"
            events = conn.receive_data(chunk)
            s.sendall(conn.data_to_send())
            if any(isinstance(e, h2.events.DataReceived) and b"data: " in e.data for e in events):
                return


def aborts(base_url: str) -> float:
    text = httpx.get(base_url + "/metrics", timeout=30).text
    m = re.search(
        r'servehall_request_aborts_total\{model="demo",reason="client_disconnect",version=""\} '
        r"([0-9.e+]+)",
        text,
    )
    return float(m.group(1)) if m else 0.0


@pytest.fixture(scope="module")
def served(
    tmp_path_factory: pytest.TempPathFactory,
    servehall_server: Callable[..., Any],
    demo_model_dir: Path,
    demo_config_factory: Callable[..., dict[str, Any]],
) -> Iterator[tuple[Any, str]]:
    url, records = sql_records(tmp_path_factory.mktemp("c19l"))
    cfg = demo_config_factory(
        demo_model_dir,
        **records,
        scheduler={"max_concurrency": 4, "max_queue": 16},
    )
    with servehall_server(cfg, name="c19l") as srv:
        yield srv, url


@pytest.fixture
def cpu_burners(served: tuple[Any, str]) -> Iterator[None]:
    """Two busy loops beside the server, as the case says (``while True: pass`` twice on a
    2-core machine): the server competes for CPU with them at normal priority."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        yield
    finally:
        for p in procs:
            p.kill()
            p.wait()


@pytest.mark.serial
def test_c19l_closed_streams_abort_under_cpu_load(
    served: tuple[Any, str], cpu_burners: None
) -> None:
    srv, url = served
    before = aborts(srv.base_url)
    log_before = srv.log_text().count("socket.send() raised exception")
    stop = threading.Event()
    side: list[int] = []

    def side_traffic() -> None:  # other requests keep being served meanwhile
        with httpx.Client(base_url=srv.base_url, timeout=120) as c:
            while not stop.is_set():
                r = c.post(
                    "/v1/chat/completions",
                    json={
                        "model": "demo",
                        "max_tokens": 4,
                        "messages": [{"role": "user", "content": "Hi"}],
                    },
                )
                side.append(r.status_code)

    other = threading.Thread(target=side_traffic)
    other.start()
    closed = 0
    try:
        for rnd in range(20):
            drop: Callable[[int, dict[str, Any]], Any] = (
                stream_then_drop if rnd % 2 == 0 else h2_stream_then_drop
            )
            pair = [threading.Thread(target=drop, args=(srv.port, BODY)) for _ in range(2)]
            for t in pair:
                t.start()
            for t in pair:
                t.join()
            closed += 2
    finally:
        stop.set()
        other.join()

    sql = (
        "SELECT status_code, finish_reason, completion_tokens FROM request_log "
        "WHERE endpoint = '/v1/completions'"
    )
    rows = wait_rows(url, sql, closed)
    assert len(rows) == closed
    assert {(r.status_code, r.finish_reason) for r in rows} == {(499, "client_disconnect")}
    assert max(r.completion_tokens for r in rows) < MAX_TOKENS  # none ran to the end
    assert aborts(srv.base_url) - before == closed
    assert side and set(side) == {200}
    assert srv.log_text().count("socket.send() raised exception") == log_before
