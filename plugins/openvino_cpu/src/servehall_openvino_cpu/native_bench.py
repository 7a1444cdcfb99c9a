"""``servehall bench engine --native`` for ``openvino_cpu``: the raw OpenVINO GenAI loop.

The same workload as the ``Engine``-protocol run, but driven the way an OpenVINO GenAI
program would drive it: one thread adds requests to a ``ContinuousBatchingPipeline`` when
they arrive (respecting the concurrency cap), calls ``step()`` while any is unfinished and
reads every ``GenerationHandle`` after each step. No asyncio, no delta streams: what is
left between this figure and the ``Engine``-protocol figure is the engine wrapper's own
cost. Greedy decoding, ``max_new_tokens`` and ``ignore_eos`` as in the other run; one
unmeasured warm-up request first.

The contract with the core (``servehall.bench.targets``): returns ``(records,
duration_s)``, one record per prompt, ``{"start": s, "prompt_tokens": n, "arrivals":
[(t_s, n_tokens), ...], "error": str}``, times in seconds since the run start;
``progress(ok)`` is called once per finished request.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from servehall_openvino_cpu.engine import OpenVINOEngine, _int64_row


def run_native(
    engine: OpenVINOEngine,
    prompts: list[list[int]],
    max_tokens: list[int],
    *,
    offsets: list[float] | None,
    max_concurrency: int | None,
    ignore_eos: bool,
    progress: Callable[[bool], None],
) -> tuple[list[dict[str, Any]], float]:
    """Run the workload on a fresh pipeline of ``engine``'s model (blocking; see module)."""
    import openvino as ov
    import openvino_genai as ov_genai

    pipe = engine.new_pipeline()
    eos = engine.model_info.eos_token_ids
    if prompts:  # warm-up (unmeasured): the first step of a fresh pipeline compiles kernels
        warm = ov_genai.GenerationConfig()
        warm.max_new_tokens = 2
        warm.do_sample = False
        engine.assist(warm)
        handle = pipe.add_request(len(prompts), ov.Tensor(_int64_row(prompts[0])), warm)
        while handle.get_status().name == "RUNNING":
            pipe.step()
    records: list[dict[str, Any]] = [
        {"start": 0.0, "prompt_tokens": len(p), "arrivals": [], "error": ""} for p in prompts
    ]
    pending = list(range(len(prompts)))
    live: dict[int, Any] = {}
    t0 = time.perf_counter()
    while pending or live:
        now = time.perf_counter() - t0
        while pending and (max_concurrency is None or len(live) < max_concurrency):
            i = pending[0]
            if offsets is not None and offsets[i] > now:
                break
            pending.pop(0)
            c = ov_genai.GenerationConfig()
            c.max_new_tokens = max_tokens[i]
            c.ignore_eos = ignore_eos
            c.do_sample = False
            if eos and not ignore_eos:
                c.eos_token_id = eos[0]
                c.stop_token_ids = set(eos)
            engine.assist(c)
            records[i]["start"] = now
            live[i] = pipe.add_request(i, ov.Tensor(_int64_row(prompts[i])), c)
        if not live:
            if offsets is not None and pending:
                time.sleep(max(0.0, offsets[pending[0]] - (time.perf_counter() - t0)))
            continue
        pipe.step()
        now = time.perf_counter() - t0
        for i, handle in list(live.items()):
            n = 0
            finish = "NONE"
            if handle.can_read():
                for out in handle.read().values():
                    n += len(out.generated_ids)
                    finish = out.finish_reason.name
            if n:
                records[i]["arrivals"].append((now, n))
            status = handle.get_status().name
            if status == "RUNNING" and finish == "NONE":
                continue
            del live[i]
            if status == "IGNORED":
                records[i]["error"] = "request does not fit the KV cache"
            progress(not records[i]["error"] and bool(records[i]["arrivals"]))
    return records, time.perf_counter() - t0
