"""In-process API test support: a scripted Engine test double, an in-memory record
collector and a host factory (unit tests only; end-to-end tests use real backends)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable, Sequence
from pathlib import Path
from typing import Any

from servehall.config.settings import Settings
from servehall.engines.contract import (
    EngineHealth,
    EngineStats,
    ModelInfo,
    SamplingParams,
    TokenDelta,
)
from servehall.plugin.host import Host, ServedModel
from servehall.plugin.manager import PluginHost
from servehall.records.types import RequestRecord
from servehall.schedulers.fcfs import FcfsScheduler
from servehall.text import TextTokenizer


class ScriptedEngine:
    """Emits the ids of ``script`` (cycled) one per step, ``step_s`` apart.

    A test double of the Engine protocol for request-path unit tests: it tracks live and
    aborted request ids so tests can assert aborts and frees.
    """

    backend = "scripted"

    def __init__(
        self,
        script: Sequence[int],
        *,
        step_s: float = 0.0,
        max_model_len: int = 256,
        supported: Iterable[str] = ("seed", "top_p"),
    ) -> None:
        self.script = list(script)
        self.step_s = step_s
        self.supported_params = frozenset(supported)
        self._info = ModelInfo(max_model_len=max_model_len)
        self.live: set[str] = set()
        self.aborted: list[str] = []
        self.params: list[SamplingParams] = []
        self.prompts: list[list[int]] = []

    @property
    def model_info(self) -> ModelInfo:
        return self._info

    async def start(self) -> None:
        pass

    async def _run(self, rid: str, params: SamplingParams) -> AsyncIterator[TokenDelta]:
        try:
            for i in range(params.max_tokens):
                if rid not in self.live:
                    yield TokenDelta((), "abort")
                    return
                await asyncio.sleep(self.step_s)
                tok = self.script[i % len(self.script)]
                if tok in params.stop_token_ids:
                    yield TokenDelta((tok,), "stop")
                    return
                yield TokenDelta((tok,), "length" if i == params.max_tokens - 1 else None)
        finally:
            self.live.discard(rid)

    def add_request(
        self, request_id: str, prompt_token_ids: Sequence[int], params: SamplingParams
    ) -> AsyncIterator[TokenDelta]:
        if request_id in self.live:
            raise ValueError("duplicate id")
        self.live.add(request_id)
        self.params.append(params)
        self.prompts.append(list(prompt_token_ids))
        return self._run(request_id, params)

    async def abort(self, request_id: str) -> None:
        if request_id in self.live:
            self.live.discard(request_id)
            self.aborted.append(request_id)

    async def health(self) -> EngineHealth:
        return EngineHealth(True)

    def stats(self) -> EngineStats:
        return EngineStats(
            running=len(self.live),
            waiting=0,
            kv_cache_blocks_used=len(self.live),
            kv_cache_blocks_total=64,
        )

    async def shutdown(self) -> None:
        self.live.clear()


class Records:
    """Collects emitted records (the RecordBus interface the request path uses)."""

    def __init__(self) -> None:
        self.records: list[RequestRecord] = []

    def emit(self, record: RequestRecord) -> None:
        self.records.append(record)

    def audit(self, event: Any) -> None:
        pass

    def check_admission(self) -> None:
        pass

    def unready_sinks(self) -> dict[str, str]:
        return {}

    async def close(self) -> None:
        pass


def make_host(
    tokenizer_dir: Path,
    engine: ScriptedEngine,
    *,
    plugins: Iterable[tuple[str, object]] = (),
    settings: dict[str, Any] | None = None,
) -> Host:
    """A Host serving ``engine`` as model ``m`` with the test tokenizer."""
    from servehall.text import load_tokenizer

    s = Settings(**(settings or {}))
    host = Host(settings=s, plugins=PluginHost([], extra=plugins))
    tok: TextTokenizer = load_tokenizer(tokenizer_dir)
    host.models["m"] = ServedModel(
        name="m",
        backend="scripted",
        engine=engine,  # type: ignore[arg-type]
        scheduler=FcfsScheduler(s.scheduler),
        tokenizer=tok,
        max_model_len=engine.model_info.max_model_len,
    )
    host.records = Records()
    host.input_filters = host.plugins.input_filters(s)
    return host


class DeltaScriptEngine:
    """Per request id, a script of ``(delay s, TokenDelta)`` pairs played in order;
    records aborts. A test double of the Engine protocol's ``add_request``/``abort`` for
    response-writer and SSE tests that need exact deltas (finish reasons, logprobs)."""

    backend = "script"

    def __init__(self, scripts: dict[str, Sequence[tuple[float, TokenDelta]]]) -> None:
        self.scripts = scripts
        self.aborted: list[str] = []

    def add_request(
        self, request_id: str, prompt_token_ids: Sequence[int], params: SamplingParams
    ) -> AsyncIterator[TokenDelta]:
        async def run() -> AsyncIterator[TokenDelta]:
            for delay, delta in self.scripts[request_id]:
                await asyncio.sleep(delay)
                yield delta

        return run()

    async def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)
