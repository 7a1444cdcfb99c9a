"""The workload straight into an :class:`~servehall.Engine`, in-process (no HTTP, no host).

This is the denominator of every "platform ÷ raw engine" ratio: the same prompts,
tokenized the way the API tokenizes them (the chat template for ``chat``, plain text
with the tokenizer's BOS for ``completions``), sent to ``Engine.add_request`` with the
same ``max_tokens``/``ignore_eos``/greedy parameters, and timed per delta exactly as the
HTTP client times SSE chunks. Nothing else runs: no scheduler, no detokenizer, no
records. The engine is built through the backend's ``BackendSpec.factory`` — the same
``Engine`` protocol the host uses, whether the engine steps on a thread or in a worker
process.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from servehall.bench.client import Endpoint, TargetError
from servehall.bench.metrics import RequestOutput
from servehall.bench.workload import BenchRequest
from servehall.engines.contract import Engine, SamplingParams
from servehall.errors import ServehallError


@dataclass(slots=True)
class LoadedEngine:
    """A started engine with the tokenizer of its model directory.

    Attributes:
        name: the ``[[models]]`` name.
        backend: the backend that built it.
        engine: the started engine.
        tokenizer: a :class:`servehall.text.tokenizer.TextTokenizer`.
        model: the ``ModelConfig``.
    """

    name: str
    backend: str
    engine: Engine
    tokenizer: Any
    model: Any

    def prompt_ids(self, req: BenchRequest, endpoint: Endpoint) -> list[int]:
        """Token ids the API would send the engine for ``req``."""
        from servehall.text.tokenizer import ChatTurn

        if endpoint == "chat" and self.tokenizer.has_chat_template:
            return list(self.tokenizer.render_chat([ChatTurn("user", req.prompt)]))
        return list(self.tokenizer.encode_plain(req.prompt, add_special_tokens=True))


@asynccontextmanager
async def loaded_engine(config: Path | str | None, model: str) -> AsyncIterator[LoadedEngine]:
    """Load the deployment in ``config``, build and start model ``model``'s engine, and
    shut it down on exit.

    Raises:
        TargetError: the model is not configured (lists the configured names).
        ServehallError: the config, backend or engine failed (its own message).
    """
    from servehall.server.bootstrap import load_deployment
    from servehall.text.tokenizer import load_tokenizer

    settings, plugins = load_deployment(config)
    names = [m.name for m in settings.models]
    mc = next((m for m in settings.models if m.name == model), None)
    if mc is None:
        known = ", ".join(names) or "none"
        raise TargetError(
            f"model {model!r} is not in the config's [[models]] (configured: {known})"
        )
    spec = plugins.backends().select(mc.backend)
    try:
        tokenizer = load_tokenizer(mc.path)
    except Exception as exc:
        raise TargetError(
            f"model {model!r}: cannot load the tokenizer from {mc.path}: {exc}"
        ) from None
    engine = spec.factory(mc)
    await engine.start()
    try:
        yield LoadedEngine(mc.name, spec.name, engine, tokenizer, mc)
    finally:
        await engine.shutdown()


_ids = itertools.count()


async def send_to_engine(
    loaded: LoadedEngine,
    req: BenchRequest,
    t0: float,
    *,
    endpoint: Endpoint = "chat",
    ignore_eos: bool = True,
    prompt_ids: Sequence[int] | None = None,
) -> RequestOutput:
    """Run one request through ``Engine.add_request`` and time its deltas (a delta with
    tokens is one arrival, as an SSE chunk is for the HTTP client)."""
    ids = list(prompt_ids) if prompt_ids is not None else loaded.prompt_ids(req, endpoint)
    params = SamplingParams(max_tokens=req.output_len, temperature=0.0, ignore_eos=ignore_eos)
    out = RequestOutput(prompt_tokens=len(ids))
    start = time.perf_counter()
    out.start = start - t0
    last = start
    tokens = arrivals = 0
    try:
        async for delta in loaded.engine.add_request(f"bench-{next(_ids)}", ids, params):
            if delta.token_ids:
                now = time.perf_counter()
                if arrivals == 0:
                    out.ttft = now - start
                else:
                    out.itl.append(now - last)
                out.token_times.append(now - t0)
                last = now
                arrivals += 1
                tokens += len(delta.token_ids)
            if delta.finish_reason in ("error", "abort"):
                out.error = f"engine {delta.finish_reason}: {delta.error or ''}".strip()
                return out
    except ServehallError as exc:
        out.error = f"engine error: {exc}"
        return out
    out.latency = last - start
    out.output_tokens = tokens
    out.success = tokens > 0
    if not out.success:
        out.error = "the engine produced no token"
    return out
