"""CPU-heavy request steps off the event loop, and giving their memory back (case N31).

* :func:`run_heavy` runs a function (tokenizing a long prompt) on one dedicated worker
  thread: the event loop stays free, and at most one such step runs at a time, so four
  huge prompts arriving together cost the memory of one, not four.
* :func:`release_memory_soon` asks glibc to return freed heap memory to the system
  (``malloc_trim(0)``) after a request that handled a large body. Without it the memory
  a 2 MB prompt needed (the JSON text, the parsed strings, the tokenizer's buffers,
  allocated partly on a worker thread's malloc arena) stays resident after it is freed:
  glibc keeps freed chunks in its arenas, and its dynamic mmap threshold makes later
  large allocations come from the heap. The trim runs on the same worker thread (never
  on the loop), at most once per ``min_interval_s``. On a C library without
  ``malloc_trim`` (musl, macOS) it does nothing.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import functools
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")

LARGE_BODY_BYTES = 1 << 20
"""A request body at least this large (bytes) triggers :func:`release_memory_soon`."""

_executor: ThreadPoolExecutor | None = None
_last_trim = float("-inf")
_trim_pending = False


def _heavy() -> ThreadPoolExecutor:
    global _executor
    if _executor is None:
        _executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="servehall-heavy")
    return _executor


async def run_heavy(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``fn(*args, **kwargs)`` on the dedicated worker thread; its result or exception."""
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(_heavy(), functools.partial(fn, *args, **kwargs))


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    if not name:
        return None
    try:
        fn = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_size_t]
    fn.restype = ctypes.c_int
    return fn  # type: ignore[no-any-return]


def trim_heap() -> bool:
    """``malloc_trim(0)`` now (blocking); True when memory was given back."""
    fn = _malloc_trim()
    return bool(fn(0)) if fn is not None else False


def release_memory_soon(min_interval_s: float = 1.0) -> None:
    """Schedule :func:`trim_heap` on the worker thread (at most once per interval).

    Call on the event loop thread after a large request's objects are released.
    """
    global _trim_pending
    if _trim_pending or _malloc_trim() is None:
        return
    _trim_pending = True
    loop = asyncio.get_running_loop()

    def trim() -> None:
        global _last_trim, _trim_pending
        # a moment for the request's frames to let go of the body, then at most once
        # per interval
        time.sleep(max(0.1, _last_trim + min_interval_s - time.monotonic()))
        try:
            trim_heap()
        finally:
            _last_trim = time.monotonic()
            _trim_pending = False

    loop.run_in_executor(_heavy(), trim)
