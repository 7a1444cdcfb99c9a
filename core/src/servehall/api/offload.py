"""CPU-heavy request steps off the event loop (case N31).

:func:`run_heavy` runs a function (tokenizing a long prompt) on one dedicated worker
thread: the event loop stays free to poll sockets between the tokenizer's GIL releases,
and at most one such step runs at a time, so several huge prompts arriving together
cost the memory of one, not several (the tokenizer's buffers for a prompt are a few
hundred bytes per token; glibc keeps what a thread's arena once held).

The first defence is not tokenizing at all: :mod:`servehall.text.budget` refuses a
prompt whose characters cannot fit the context before any tokenization, so a 2 MB
prompt for a 2048-token model costs its JSON parse and nothing more. (Calling glibc's
``malloc_trim`` after such requests was tried and left out: it walks every arena with
the arena locks held, so every other thread's ``malloc`` — the event loop's included —
waits for it.)
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from servehall.text.tokenizer import TextTokenizer

T = TypeVar("T")

LONG_TEXT = 20_000
"""Characters (or token ids) past which tokenizing (decoding) runs on the worker thread."""

_executor: ThreadPoolExecutor | None = None


def _heavy() -> ThreadPoolExecutor:
    global _executor
    if _executor is None:
        _executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="servehall-heavy")
    return _executor


async def run_heavy(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``fn(*args, **kwargs)`` on the dedicated worker thread; its result or exception."""
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(_heavy(), functools.partial(fn, *args, **kwargs))


async def encode_plain(tok: TextTokenizer, text: str) -> list[int]:
    """``tok.encode_plain(text, add_special_tokens=True)`` (token ids), on the worker
    thread when ``text`` is longer than :data:`LONG_TEXT` characters."""
    if len(text) > LONG_TEXT:
        return await run_heavy(tok.encode_plain, text, add_special_tokens=True)
    return tok.encode_plain(text, add_special_tokens=True)
