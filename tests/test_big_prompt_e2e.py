"""N31: one big prompt must not stall everyone.

A real server on the demo model (context 2048). While a client polls ``/health/live``
and a streamed completion runs, chat requests whose one message is ``"word "`` repeated
419,000 times (≈ 2 MB, under ``max_body_bytes``) arrive — one, then four at once. Each
gets 400 ``context_length_exceeded`` from the character bound (no tokenization); the
stream and the health polls keep being answered; resident memory goes back to within
50 MB of its earlier level. The timing target (≤ 50 ms of waiting) is measured by
``bench/bench_reliability.py big-prompt``, not asserted here.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

BIG = {
    "model": "demo",
    "max_tokens": 8,
    "messages": [{"role": "user", "content": "word " * 419_000}],
}


def rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


@pytest.fixture(scope="module")
def server(
    servehall_server: Callable[..., Any],
    demo_model_dir: Path,
    demo_config_factory: Callable[..., dict[str, Any]],
) -> Iterator[Any]:
    cfg = demo_config_factory(demo_model_dir)  # max_body_bytes: 4 MiB by default
    with servehall_server(cfg, name="big-prompt") as srv:
        yield srv


def test_n31_big_prompts_are_refused_without_stalling(server: Any) -> None:
    base = server.base_url
    with httpx.Client(base_url=base, timeout=120) as c:
        # warm up: a big prompt once (allocator arenas, code paths), then measure memory
        assert c.post("/v1/chat/completions", json=BIG).status_code == 400
        time.sleep(1.5)
        before = rss(server.process.pid)

    stop = threading.Event()
    polls: list[int] = []

    def poll() -> None:
        with httpx.Client(base_url=base, timeout=120) as c:
            while not stop.is_set():
                polls.append(c.get("/health/live").status_code)
                time.sleep(0.02)

    stream_events: list[bytes] = []

    def stream() -> None:
        body = {"model": "demo", "prompt": "ABCDEFGH", "max_tokens": 400, "stream": True}
        with (
            httpx.Client(base_url=base, timeout=120) as c,
            c.stream("POST", "/v1/completions", json=body) as r,
        ):
            assert r.status_code == 200
            for line in r.iter_lines():
                if line.startswith("data: "):
                    stream_events.append(line.encode())

    poller = threading.Thread(target=poll)
    streamer = threading.Thread(target=stream)
    poller.start()
    streamer.start()
    try:
        with httpx.Client(base_url=base, timeout=120) as c:
            polls_before = len(polls)
            one = c.post("/v1/chat/completions", json=BIG)
        with ThreadPoolExecutor(4) as pool:

            def big(_: int) -> httpx.Response:
                with httpx.Client(base_url=base, timeout=120) as c:
                    return c.post("/v1/chat/completions", json=BIG)

            four = list(pool.map(big, range(4)))
        polls_during = len(polls) - polls_before
    finally:
        streamer.join()
        stop.set()
        poller.join()
    for r in [one, *four]:
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["code"] == "context_length_exceeded" and err["param"] == "messages"
        assert "characters, which is at least" in err["message"]  # refused by the bound
        assert len(r.content) < 2000
    assert set(polls) == {200} and polls_during > 0
    assert stream_events and stream_events[-1] == b"data: [DONE]"
    end = time.monotonic() + 5
    while rss(server.process.pid) - before > 50 * 1024 * 1024 and time.monotonic() < end:
        time.sleep(0.2)
    grown = rss(server.process.pid) - before
    assert grown <= 50 * 1024 * 1024, f"RSS grew {grown / 2**20:.0f} MiB"
    with httpx.Client(base_url=base, timeout=60) as c:
        ok = c.post(
            "/v1/chat/completions",
            json={
                "model": "demo",
                "max_tokens": 4,
                "messages": [{"role": "user", "content": "Hi"}],
            },
        )
        assert ok.status_code == 200
