"""``servehall.api.offload``: heavy steps run on one dedicated worker thread (results and
exceptions come back; one at a time), and ``encode_plain`` moves only long texts there."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from servehall.api.offload import LONG_TEXT, encode_plain, run_heavy


async def test_run_heavy_returns_result_and_raises_errors() -> None:
    def add(a: int, b: int = 0) -> tuple[int, str]:
        return a + b, threading.current_thread().name

    total, thread = await run_heavy(add, 2, b=3)
    assert total == 5 and thread.startswith("servehall-heavy")
    assert thread != threading.current_thread().name

    def fail() -> None:
        raise KeyError("nope")

    with pytest.raises(KeyError):
        await run_heavy(fail)


async def test_one_heavy_step_at_a_time_and_the_loop_stays_free() -> None:
    running = 0
    most = 0
    lock = threading.Lock()

    def work() -> None:
        nonlocal running, most
        with lock:
            running += 1
            most = max(most, running)
        time.sleep(0.02)
        with lock:
            running -= 1

    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.001)
            ticks += 1

    t = asyncio.ensure_future(ticker())
    await asyncio.gather(*(run_heavy(work) for _ in range(4)))
    t.cancel()
    assert most == 1
    assert ticks > 5  # the event loop ran while the steps did


class Tok:
    def __init__(self) -> None:
        self.threads: list[str] = []

    def encode_plain(self, text: str, add_special_tokens: bool = False) -> list[int]:
        self.threads.append(threading.current_thread().name)
        return [len(text), int(add_special_tokens)]


async def test_encode_plain_offloads_only_long_texts() -> None:
    tok = Tok()
    assert await encode_plain(tok, "short") == [5, 1]  # type: ignore[arg-type]
    assert await encode_plain(tok, "x" * LONG_TEXT) == [LONG_TEXT, 1]  # type: ignore[arg-type]
    assert await encode_plain(tok, "x" * (LONG_TEXT + 1)) == [LONG_TEXT + 1, 1]  # type: ignore[arg-type]
    main = threading.current_thread().name
    assert tok.threads[0] == main and tok.threads[1] == main
    assert tok.threads[2].startswith("servehall-heavy")
