"""A client that stops reading cannot hold a scheduler slot (``[server] send_timeout_s``).

A real server on the demo model with one slot (``max_concurrency = 1``). An HTTP/2
client opens a stream with a one-byte flow-control window and never reads again (what an
httpx client does by accident once its connection window is used up: encode/httpcore#943).
The request must end as one ``request_log`` row 499 ``client_stalled`` within about
``send_timeout_s``, and the next request — which needs that one slot — must be answered
200 long before its queue timeout. Without the bound the second request waits out
``queue_timeout_s`` and gets a 503.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import h2.settings
import httpx
import pytest

from servehall.db.testing import wait_rows
from servehall.testing.rawhttp import H2Client
from tests.conftest import sql_records

SEND_TIMEOUT_S = 1.0
QUEUE_TIMEOUT_S = 25.0


@pytest.fixture(scope="module")
def served(
    tmp_path_factory: pytest.TempPathFactory,
    servehall_server: Callable[..., Any],
    demo_model_dir: Path,
    demo_config_factory: Callable[..., dict[str, Any]],
) -> Iterator[tuple[Any, str]]:
    url, records = sql_records(tmp_path_factory.mktemp("stall"))
    cfg = demo_config_factory(
        demo_model_dir,
        **records,
        scheduler={"max_concurrency": 1, "max_queue": 8, "queue_timeout_s": QUEUE_TIMEOUT_S},
        server={"send_timeout_s": SEND_TIMEOUT_S},
    )
    with servehall_server(cfg, name="stall") as srv:
        yield srv, url


def open_and_stop_reading(port: int, body: dict[str, Any]) -> socket.socket:
    """Send ``body`` on a fresh h2c connection whose stream window is one byte; never
    read (so no ``WINDOW_UPDATE`` ever follows). Returns the open socket."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=60)
    client = H2Client(sock)
    client.conn.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 1})
    client.flush()
    client.request(
        "POST", "/v1/completions", [("content-type", "application/json")], json.dumps(body).encode()
    )
    return sock


@pytest.mark.parametrize(
    ("stream", "closes"),
    [(True, False), (False, False), (True, True)],
    ids=["streamed", "not-streamed", "streamed-then-closed"],
)
def test_a_client_that_stops_reading_frees_its_slot(
    served: tuple[Any, str], stream: bool, closes: bool
) -> None:
    """``closes``: the client closes its connection while the server's last write still
    waits for the window (the response was all handed over, so the close reads as the
    normal end of a response): the write must still be bounded."""
    srv, url = served
    sql = "SELECT status_code, finish_reason, error_code FROM request_log WHERE status_code <> 200"
    before = len(wait_rows(url, sql, 0))
    body = {
        "model": "demo",
        "prompt": "The sailor",
        "max_tokens": 32,
        "temperature": 0,
        "ignore_eos": True,
        "stream": stream,
    }
    sock = open_and_stop_reading(srv.port, body)
    try:
        time.sleep(0.3)  # the stalled request takes the one slot first
        if closes:
            time.sleep(0.5)  # its last write waits for the window
            sock.close()
        t0 = time.monotonic()
        r = httpx.post(
            srv.base_url + "/v1/completions",
            json={"model": "demo", "prompt": "Hi", "max_tokens": 2},
            timeout=QUEUE_TIMEOUT_S + 30,
        )
        waited = time.monotonic() - t0
        assert r.status_code == 200, r.text
        assert waited < QUEUE_TIMEOUT_S / 2, waited  # the slot came free at the stall bound
    finally:
        sock.close()
    got = wait_rows(url, sql, before + 1)[before:]
    assert [(g.status_code, g.finish_reason, g.error_code) for g in got] == [
        (499, "client_disconnect", "client_stalled")
    ]
    assert "ended (499 client_stalled)" in srv.log_text()
