"""Run one workload against one target — an HTTP server or an in-process engine — with a
rich progress bar on stderr. Shared by ``bench serve``, ``bench engine`` and
``bench compare``."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
)

from servehall.bench.client import ClientOptions, TargetError, make_client, preflight, send_request
from servehall.bench.metrics import RequestOutput
from servehall.bench.runner import RunResult, run_workload
from servehall.bench.workload import BenchRequest

if TYPE_CHECKING:
    from servehall.bench.engine_driver import LoadedEngine
    from servehall.bench.workload import WorkloadSpec


@contextmanager
def progress_bar(label: str, total: int, *, quiet: bool) -> Iterator[Any]:
    """A rich progress bar (stderr) counting finished and failed requests; yields the
    per-request callback (a no-op when ``quiet``)."""
    if quiet:
        yield lambda out: None
        return
    failed = 0
    progress = Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("failed {task.fields[failed]}"),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        transient=True,
    )
    task = progress.add_task(label, total=total, failed=0)

    def tick(out: RequestOutput) -> None:
        nonlocal failed
        failed += 0 if out.success else 1
        progress.update(task, advance=1, failed=failed)

    with progress:
        yield tick


async def run_serve(
    opts: ClientOptions,
    spec: WorkloadSpec,
    requests: Sequence[BenchRequest],
    *,
    quiet: bool = False,
    label: str | None = None,
    after_preflight: Callable[[], object] | None = None,
) -> RunResult:
    """Preflight, then run ``requests`` against the server (raises TargetError when the
    preflight fails: unreachable, 401, unknown model...). ``after_preflight`` is called
    between the two (e.g. to read a CPU counter)."""
    conns = spec.concurrency or len(requests)
    async with make_client(opts, 1 if opts.http2 else conns) as client:
        await preflight(client, opts, requests[0])
        if after_preflight is not None:
            after_preflight()

        async def send(req: BenchRequest, t0: float) -> RequestOutput:
            return await send_request(client, opts, req, t0)

        with progress_bar(label or opts.root, len(requests), quiet=quiet) as tick:
            return await run_workload(
                requests,
                send,
                offsets=spec.offsets(),
                max_concurrency=spec.concurrency,
                progress=tick,
            )


def output_from_record(record: dict[str, Any]) -> RequestOutput:
    """A :class:`RequestOutput` from a native runner's record: ``{"start": s,
    "prompt_tokens": n, "arrivals": [(t_s, n_tokens), ...], "error": str}`` (times in
    seconds since the run start)."""
    arrivals = [(float(t), int(n)) for t, n in record.get("arrivals", ())]
    start = float(record.get("start", 0.0))
    out = RequestOutput(prompt_tokens=int(record.get("prompt_tokens", 0)), start=start)
    out.error = str(record.get("error") or "")
    if not arrivals:
        out.error = out.error or "the engine produced no token"
        return out
    times = [t for t, _ in arrivals]
    out.ttft = times[0] - start
    out.itl = [b - a for a, b in itertools.pairwise(times)]
    out.latency = times[-1] - start
    out.token_times = times
    out.output_tokens = sum(n for _, n in arrivals)
    out.success = not out.error
    return out


async def run_engine(
    loaded: LoadedEngine,
    spec: WorkloadSpec,
    requests: Sequence[BenchRequest],
    *,
    native: bool = False,
    quiet: bool = False,
    label: str | None = None,
) -> tuple[RunResult, float, str]:
    """Run ``requests`` straight into the engine. Returns ``(result, cpu_s, api)``:
    ``cpu_s`` is this process's CPU time during the run (all threads), ``api`` is
    ``"Engine protocol"`` or the native API's name.

    With ``native``, the engine's optional ``bench_native(prompts, max_tokens, *, offsets,
    max_concurrency, ignore_eos, progress)`` coroutine runs the workload through the
    backend's own API and returns ``(records, duration_s)`` (see
    :func:`output_from_record`); ``progress(ok)`` is called per finished request.
    Raises TargetError when ``native`` is asked of an engine without one."""
    from servehall.bench.engine_driver import send_to_engine

    prompts = [loaded.prompt_ids(r, spec.endpoint) for r in requests]
    by_request = {id(r): p for r, p in zip(requests, prompts, strict=True)}
    runner = getattr(loaded.engine, "bench_native", None) if native else None
    if native and runner is None:
        raise TargetError(
            f"backend {loaded.backend!r} exposes no native benchmark API; drop --native"
        )
    label = label or f"engine {loaded.name}"
    if runner is None:  # warm-up (unmeasured); a native runner warms its own pipeline
        warm = BenchRequest(requests[0].prompt, requests[0].prompt_len, 2)
        await send_to_engine(loaded, warm, time.perf_counter(), prompt_ids=prompts[0])
    cpu0 = time.process_time()
    with progress_bar(label, len(requests), quiet=quiet) as tick:
        if runner is not None:
            try:
                records, duration = await runner(
                    prompts,
                    [r.output_len for r in requests],
                    offsets=spec.offsets(),
                    max_concurrency=spec.concurrency,
                    ignore_eos=spec.ignore_eos,
                    progress=lambda ok: tick(RequestOutput(success=ok)),
                )
            except Exception as exc:
                detail = f"{type(exc).__name__}: {exc}".splitlines()[0]
                raise TargetError(f"the native run of {loaded.backend} failed: {detail}") from None
            result = RunResult([output_from_record(r) for r in records], max(duration, 1e-9))
            api = str(getattr(loaded.engine, "bench_native_name", "native API"))
        else:

            async def send(req: BenchRequest, t0: float) -> RequestOutput:
                return await send_to_engine(
                    loaded, req, t0, ignore_eos=spec.ignore_eos, prompt_ids=by_request[id(req)]
                )

            result = await run_workload(
                requests,
                send,
                offsets=spec.offsets(),
                max_concurrency=spec.concurrency,
                progress=tick,
            )
            api = "Engine protocol"
    cpu_s = time.process_time() - cpu0
    return result, cpu_s, api


__all__ = ["TargetError", "progress_bar", "run_engine", "run_serve"]
