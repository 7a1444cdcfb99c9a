"""Drive a workload through any sender: arrivals, concurrency cap, progress, timing.

A *sender* is an async callable ``send(request, t0) -> RequestOutput`` (HTTP in
:mod:`servehall.bench.client`, in-process in :mod:`servehall.bench.engine_driver`);
``t0`` is the run's ``perf_counter`` origin, so every :class:`RequestOutput` time is on
one clock. :func:`run_workload` sends each request at its arrival offset, keeps at most
``max_concurrency`` in flight (None = unbounded) and returns the outputs in workload
order with the run's duration (first send → last completion).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from servehall.bench.metrics import RequestOutput
from servehall.bench.workload import BenchRequest

Sender = Callable[[BenchRequest, float], Awaitable[RequestOutput]]
"""``send(request, t0)``: perform one request; times relative to ``t0`` (perf_counter)."""

Progress = Callable[[RequestOutput], None]
"""Called once per finished request (successful or not)."""


@dataclass(frozen=True, slots=True)
class RunResult:
    """Per-request outputs (workload order) and the run's wall time in seconds."""

    outputs: list[RequestOutput]
    duration_s: float


async def run_workload(
    requests: Sequence[BenchRequest],
    send: Sender,
    *,
    offsets: Sequence[float] | None = None,
    max_concurrency: int | None = None,
    progress: Progress | None = None,
) -> RunResult:
    """Send ``requests`` at ``offsets`` (seconds after start; None = all at once) with at
    most ``max_concurrency`` in flight. A sender exception becomes a failed output with
    the exception's one-line text, so one bad request never ends the run."""
    if offsets is not None and len(offsets) != len(requests):
        raise ValueError("offsets and requests differ in length")
    limit = asyncio.Semaphore(max_concurrency) if max_concurrency else None
    outputs: list[RequestOutput | None] = [None] * len(requests)
    t0 = time.perf_counter()

    async def one(i: int, req: BenchRequest) -> None:
        if offsets is not None:
            delay = t0 + offsets[i] - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
        if limit is not None:
            await limit.acquire()
        try:
            out = await send(req, t0)
        except Exception as exc:
            out = RequestOutput(error=f"{type(exc).__name__}: {exc}".splitlines()[0])
        finally:
            if limit is not None:
                limit.release()
        outputs[i] = out
        if progress is not None:
            progress(out)

    await asyncio.gather(*(one(i, r) for i, r in enumerate(requests)))
    duration = time.perf_counter() - t0
    done = [o for o in outputs if o is not None]
    return RunResult(done, max(duration, 1e-9))
