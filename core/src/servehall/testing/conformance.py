"""Backend conformance suite: what every device backend's :class:`~servehall.Engine` must do.

A device plugin runs it against itself with one fixture and one subclass::

    # plugins/mydevice/tests/test_mydevice_conformance.py
    import pytest
    from servehall.testing.conformance import BackendConformance

    class TestMyDeviceConformance(BackendConformance):
        @pytest.fixture
        def conformance_engine_factory(self, tmp_path):
            model = ModelConfig(name="tiny", path=..., backend="mydevice", options={...})
            return lambda: build_my_engine(model)          # an UNSTARTED engine

        # optional: the BackendSpec, for the probe test (skipped without it)
        @pytest.fixture
        def conformance_backend_spec(self):
            return BackendSpec("mydevice", probe, factory)

        # optional: make a started engine die like a device fault would
        @pytest.fixture
        def conformance_crash(self):
            return lambda engine: engine.inject_fault()

The suite checks: the engine starts and stops cleanly (shutdown idempotent, health false
afterwards); deltas stream in order and end with exactly one ``finish_reason`` delta;
greedy output is deterministic; concurrent and mid-batch joining requests do not change
each other's greedy output; an aborted (or ``aclose``-d) request's stream ends with
``abort`` and its KV blocks are released (``stats()``); stats are sane; the probe never
raises; health reports a dead engine. Prompts are token ids (no tokenizer needed) drawn
from ``[3, vocab_size)``.

Every test runs twice (fixture ``conformance_isolation``): ``thread`` drives the engine of
``conformance_engine_factory`` in this process; ``process`` runs the same backend in an
engine worker process (:class:`~servehall.worker.ProcessEngine`, restarts off), built
from the fixture ``conformance_worker_model`` — ``(plugins, ModelConfig)``, the enabled
plugin names and the ``[[models]]`` entry whose ``backend`` the worker builds — and made
to die by SIGKILL of the worker in the dead-engine test. Without that fixture the
``process`` runs are skipped.

A torch device backend whose engines run the tiny random Llama (``servehall_tiny_llama``)
needs no fixture at all: subclass :class:`TinyLlamaConformance` and set ``backend``,
``plugins`` and ``model_options``.

Class attributes tune it: ``max_tokens`` (decode length of the comparison runs),
``long_tokens`` (length of the requests that get aborted or joined mid-way),
``timeout_s`` (per wait), ``kv_release_timeout_s``, ``share_engine`` (True: the tests that
only use a running engine share one start per class and isolation mode — for engines that
take minutes to start, such as vLLM; the start/stop and dead-engine tests still start
their own).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, ClassVar

import pytest

from servehall.config.models import ModelConfig
from servehall.engines.backends import BackendSpec, ProbeResult
from servehall.engines.contract import Engine, EngineStats, SamplingParams, TokenDelta
from servehall.errors import EngineError
from servehall.plugin.manager import PluginHost

WorkerModel = tuple[tuple[str, ...], ModelConfig]
"""``(plugins, model)`` for process-mode runs (fixture ``conformance_worker_model``)."""

_SHARED: dict[tuple[type, str], Engine] = {}
"""Engines kept running between the tests of a class with ``share_engine``."""

EngineFactory = Callable[[], Engine]
"""Builds an unstarted engine (fixture ``conformance_engine_factory``)."""

CrashFn = Callable[[Engine], Awaitable[None] | None]
"""Makes a started engine die (fixture ``conformance_crash``)."""


def greedy(max_tokens: int) -> SamplingParams:
    """Greedy decoding of exactly ``max_tokens`` tokens (EOS ignored)."""
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)


async def collect(stream: AsyncIterator[TokenDelta], timeout: float) -> list[TokenDelta]:
    """Every delta of ``stream`` (raises TimeoutError when it does not end in time)."""

    async def run() -> list[TokenDelta]:
        return [d async for d in stream]

    return await asyncio.wait_for(run(), timeout)


def tokens_of(deltas: list[TokenDelta]) -> list[int]:
    """Concatenated token ids of a delta list."""
    return [t for d in deltas for t in d.token_ids]


def check_stream_shape(deltas: list[TokenDelta]) -> None:
    """Exactly one terminal delta, last; non-terminal deltas carry at least one token."""
    assert deltas, "stream produced no delta at all"
    assert deltas[-1].finish_reason is not None, (
        f"stream did not end with a finish_reason: {deltas}"
    )
    for d in deltas[:-1]:
        assert d.finish_reason is None, f"finish_reason before the end: {deltas}"
        assert d.token_ids, f"empty non-terminal delta: {deltas}"


def check_stats(stats: EngineStats) -> None:
    """Counters are non-negative and used <= total."""
    assert isinstance(stats, EngineStats)
    assert stats.running >= 0 and stats.waiting >= 0
    assert stats.kv_cache_blocks_total > 0
    assert 0 <= stats.kv_cache_blocks_used <= stats.kv_cache_blocks_total
    used, total = stats.device_memory_used_bytes, stats.device_memory_total_bytes
    if used is not None:
        assert used >= 0
    if used is not None and total is not None:
        assert total > 0 and used <= total


class BackendConformance:
    """Subclass and provide the fixture ``conformance_engine_factory`` (see module doc)."""

    max_tokens: int = 12
    long_tokens: int = 200
    share_engine: ClassVar[bool] = False
    timeout_s: float = 120.0
    kv_release_timeout_s: float = 10.0

    # --- fixtures ----------------------------------------------------------------------

    @pytest.fixture(params=["thread", "process"])
    def conformance_isolation(self, request: pytest.FixtureRequest) -> str:
        """``thread``: the engine in this process; ``process``: in a worker process."""
        return str(request.param)

    @pytest.fixture
    def conformance_worker_model(self) -> WorkerModel | None:
        """``(plugins, ModelConfig)`` for the ``process`` runs; None skips them."""
        return None

    @pytest.fixture(scope="class", autouse=True)
    @classmethod
    async def _shared_engines(cls) -> AsyncIterator[None]:
        """Shut down the engines :meth:`running` shared within this class (``share_engine``).

        A classmethod: pytest 9 deprecates class-scoped fixtures defined as instance
        methods (``PytestRemovedIn10Warning``); this one only reads class attributes."""
        yield
        for key in [k for k in _SHARED if k[0] is cls]:
            engine = _SHARED.pop(key)
            await asyncio.wait_for(engine.shutdown(), cls.timeout_s)

    @pytest.fixture
    def engine_factory(
        self,
        conformance_isolation: str,
        conformance_engine_factory: EngineFactory,
        conformance_worker_model: WorkerModel | None,
    ) -> EngineFactory:
        """Unstarted engines in the isolation mode under test."""
        if conformance_isolation == "thread":
            return conformance_engine_factory
        if conformance_worker_model is None:
            pytest.skip("no conformance_worker_model fixture: process mode not run")
        from servehall.worker import ProcessEngine

        plugins, model = conformance_worker_model
        settings = model.worker.model_copy(  # keeps worker.python
            update={
                "crash_loop_restarts": 0,
                "step_timeout_s": self.timeout_s,
                "start_timeout_s": self.timeout_s,
            }
        )

        def factory() -> Engine:
            return ProcessEngine(model, model.backend, plugins, settings=settings)

        factory.share_key = conformance_isolation  # type: ignore[attr-defined]
        return factory

    @pytest.fixture
    def crash_fn(
        self, conformance_isolation: str, conformance_crash: CrashFn | None
    ) -> CrashFn | None:
        """How the dead-engine test kills an engine: SIGKILL of the worker in process mode."""
        if conformance_isolation == "thread":
            return conformance_crash

        def kill_worker(engine: Any) -> None:
            import os
            import signal

            os.kill(engine.worker_pid, signal.SIGKILL)

        return kill_worker

    # --- helpers -----------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def running(self, factory: EngineFactory) -> AsyncIterator[Engine]:
        """Start an engine from ``factory`` and shut it down afterwards."""
        key = (type(self), getattr(factory, "share_key", "thread"))
        if self.share_engine and key in _SHARED:
            yield _SHARED[key]
            return
        engine = factory()
        assert isinstance(engine, Engine), f"{type(engine).__name__} is not an Engine"
        await asyncio.wait_for(engine.start(), self.timeout_s)
        if self.share_engine:
            _SHARED[key] = engine  # shut down by the class fixture _shared_engines
            yield engine
            return
        try:
            yield engine
        finally:
            await asyncio.wait_for(engine.shutdown(), self.timeout_s)

    def prompts(self, engine: Engine) -> list[list[int]]:
        """Four prompts of different lengths with ids in ``[3, vocab_size)``."""
        vocab = engine.model_info.vocab_size or 100
        span = max(vocab - 3, 1)
        lengths = (5, 11, 3, 17)
        return [[3 + (17 * i + 7 * j + 1) % span for j in range(n)] for i, n in enumerate(lengths)]

    async def run_one(
        self, engine: Engine, request_id: str, prompt: list[int], params: SamplingParams
    ) -> list[TokenDelta]:
        deltas = await collect(engine.add_request(request_id, prompt, params), self.timeout_s)
        check_stream_shape(deltas)
        return deltas

    async def wait_kv_released(self, engine: Engine) -> EngineStats:
        deadline = time.monotonic() + self.kv_release_timeout_s
        while True:
            stats = engine.stats()
            check_stats(stats)
            if stats.kv_cache_blocks_used == 0 and stats.running == 0 and stats.waiting == 0:
                return stats
            if time.monotonic() > deadline:
                raise AssertionError(f"KV blocks not released after abort: {stats}")
            await asyncio.sleep(0.02)

    # --- the suite ---------------------------------------------------------------------

    def test_probe_never_raises(self, conformance_backend_spec: BackendSpec | None) -> None:
        if conformance_backend_spec is None:
            pytest.skip("no conformance_backend_spec fixture")
        result = conformance_backend_spec.probe()
        assert isinstance(result, ProbeResult)
        assert isinstance(result.available, bool)
        assert isinstance(result.reason, str) and result.reason.strip()

    async def test_starts_and_stops_cleanly(self, engine_factory: EngineFactory) -> None:
        engine = engine_factory()
        await asyncio.wait_for(engine.start(), self.timeout_s)
        health = await engine.health()
        assert health.ok, health.reason
        info = engine.model_info
        assert info.max_model_len > 0
        assert isinstance(engine.backend, str) and engine.backend
        check_stats(engine.stats())
        await asyncio.wait_for(engine.shutdown(), self.timeout_s)
        health = await engine.health()
        assert not health.ok and health.reason
        await asyncio.wait_for(engine.shutdown(), self.timeout_s)  # idempotent

    async def test_streams_deltas_in_order(self, engine_factory: EngineFactory) -> None:
        async with self.running(engine_factory) as engine:
            prompt = self.prompts(engine)[0]
            deltas = await self.run_one(engine, "order-1", prompt, greedy(self.max_tokens))
            assert deltas[-1].finish_reason == "length"
            assert len(tokens_of(deltas)) == self.max_tokens
            assert all(
                0 <= t < (engine.model_info.vocab_size or 1 << 31) for t in tokens_of(deltas)
            )
            # stop when EOS is honoured: a stream ends with "stop" or "length", never both
            normal = await self.run_one(
                engine, "order-2", prompt, SamplingParams(max_tokens=self.max_tokens, temperature=0)
            )
            assert normal[-1].finish_reason in ("stop", "length")
            assert len(tokens_of(normal)) <= self.max_tokens

    async def test_duplicate_request_id_rejected(self, engine_factory: EngineFactory) -> None:
        async with self.running(engine_factory) as engine:
            prompt = self.prompts(engine)[0]
            stream = engine.add_request("dup", prompt, greedy(self.long_tokens))
            with pytest.raises(ValueError):
                engine.add_request("dup", prompt, greedy(2))
            await engine.abort("dup")
            deltas = await collect(stream, self.timeout_s)
            assert deltas[-1].finish_reason == "abort"

    async def test_greedy_is_deterministic(self, engine_factory: EngineFactory) -> None:
        async with self.running(engine_factory) as engine:
            prompts = self.prompts(engine)
            first = [
                tokens_of(await self.run_one(engine, f"g1-{i}", p, greedy(self.max_tokens)))
                for i, p in enumerate(prompts)
            ]
            second = [
                tokens_of(await self.run_one(engine, f"g2-{i}", p, greedy(self.max_tokens)))
                for i, p in enumerate(prompts)
            ]
            assert first == second
            together = await asyncio.gather(
                *(
                    self.run_one(engine, f"g3-{i}", p, greedy(self.max_tokens))
                    for i, p in enumerate(prompts)
                )
            )
            assert [tokens_of(d) for d in together] == first, "batching changed greedy output"

    async def test_mid_batch_join_keeps_outputs(self, engine_factory: EngineFactory) -> None:
        async with self.running(engine_factory) as engine:
            a, b = self.prompts(engine)[1], self.prompts(engine)[3]
            n = min(self.long_tokens, 48)
            alone_a = tokens_of(await self.run_one(engine, "alone-a", a, greedy(n)))
            alone_b = tokens_of(await self.run_one(engine, "alone-b", b, greedy(self.max_tokens)))
            stream_a = engine.add_request("join-a", a, greedy(n))
            head: list[TokenDelta] = []
            async with asyncio.timeout(self.timeout_s):
                async for d in stream_a:
                    head.append(d)
                    if len(tokens_of(head)) >= 2 or d.finish_reason:
                        break
            joined_b = await self.run_one(engine, "join-b", b, greedy(self.max_tokens))
            rest = await collect(stream_a, self.timeout_s) if not head[-1].finish_reason else []
            all_a = head + rest
            check_stream_shape(all_a)
            assert tokens_of(all_a) == alone_a, (
                "a request joining mid-batch changed another's output"
            )
            assert tokens_of(joined_b) == alone_b

    async def test_abort_ends_stream_and_frees_kv(self, engine_factory: EngineFactory) -> None:
        async with self.running(engine_factory) as engine:
            prompt = self.prompts(engine)[3]
            stream = engine.add_request("ab-1", prompt, greedy(self.long_tokens))
            async with asyncio.timeout(self.timeout_s):
                first = await anext(stream)
            assert first.finish_reason is None
            busy = engine.stats()
            check_stats(busy)
            assert busy.running + busy.waiting >= 1 or busy.kv_cache_blocks_used >= 1
            await engine.abort("ab-1")
            rest = await collect(stream, self.timeout_s)
            assert rest and rest[-1].finish_reason == "abort"
            check_stream_shape([first, *rest])
            await self.wait_kv_released(engine)
            # closing the iterator early aborts too
            stream2 = engine.add_request("ab-2", prompt, greedy(self.long_tokens))
            async with asyncio.timeout(self.timeout_s):
                await anext(stream2)
            await stream2.aclose()  # type: ignore[attr-defined]
            await self.wait_kv_released(engine)
            # aborting unknown or finished ids is a no-op; the engine still serves
            await engine.abort("never-existed")
            again = await self.run_one(engine, "ab-3", prompt, greedy(3))
            assert len(tokens_of(again)) == 3

    async def test_stats_are_sane(self, engine_factory: EngineFactory) -> None:
        async with self.running(engine_factory) as engine:
            # idle: nothing running or waiting, no KV block in use (a shared engine's
            # previous test may still be settling: a worker process reports its stats
            # with its heartbeats)
            await self.wait_kv_released(engine)
            prompts = self.prompts(engine)
            streams = [
                engine.add_request(f"st-{i}", p, greedy(self.long_tokens))
                for i, p in enumerate(prompts)
            ]
            async with asyncio.timeout(self.timeout_s):
                for s in streams:
                    await anext(s)
            busy = engine.stats()
            # a worker process reports its stats with its heartbeats: the first snapshot
            # after the first token may predate the KV blocks of this step (a few ms)
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 5
            while busy.kv_cache_blocks_used < 1 and loop.time() < deadline:
                await asyncio.sleep(0.05)
                busy = engine.stats()
            check_stats(busy)
            assert busy.running + busy.waiting >= 1
            assert busy.running + busy.waiting <= len(prompts)
            assert busy.kv_cache_blocks_used >= 1
            for i in range(len(prompts)):
                await engine.abort(f"st-{i}")
            for s in streams:
                await collect(s, self.timeout_s)
            await self.wait_kv_released(engine)

    async def test_health_reports_dead_engine(
        self,
        engine_factory: EngineFactory,
        crash_fn: CrashFn | None,
    ) -> None:
        engine = engine_factory()
        await asyncio.wait_for(engine.start(), self.timeout_s)
        try:
            assert (await engine.health()).ok
            if crash_fn is None:
                await engine.shutdown()
            else:
                prompt = self.prompts(engine)[0]
                stream = engine.add_request("dead-1", prompt, greedy(self.long_tokens))
                result: Any = crash_fn(engine)
                if inspect.isawaitable(result):
                    await result
                deltas = await collect(stream, self.timeout_s)
                assert deltas[-1].finish_reason == "error", "in-flight stream did not fail"
            deadline = time.monotonic() + self.timeout_s
            while (health := await engine.health()).ok:
                assert time.monotonic() < deadline, "health still ok after the engine died"
                await asyncio.sleep(0.05)
            assert health.reason
            try:
                stream = engine.add_request("dead-2", self.prompts(engine)[0], greedy(2))
            except EngineError:
                pass  # refusing outright is fine too
            else:
                after = await collect(stream, self.timeout_s)
                assert after[-1].finish_reason == "error", "a dead engine accepted work"
        finally:
            await asyncio.wait_for(engine.shutdown(), self.timeout_s)


class TinyLlamaConformance(BackendConformance):
    """:class:`BackendConformance` for a registered backend on the tiny random Llama.

    The engine factory builds ``[[models]] name="tiny"`` on the session fixture
    ``servehall_tiny_llama`` with the backend ``backend`` as loaded by
    ``PluginHost(plugins)``; a torch device plugin's whole conformance test is then::

        class TestMyDeviceConformance(TinyLlamaConformance):
            backend = "mydevice"
            plugins = ("mydevice",)
            model_options = {"dtype": "float32", "kv_cache_blocks": 96, "block_size": 16}

    Class attributes:
        backend: the backend name whose ``BackendSpec.factory`` builds the engines.
        plugins: the plugin names to enable (``()`` = the core's default plugins only).
        probe_backend: the backend whose probe the probe test checks (None = ``backend``).
        max_model_len: the model's ``max_model_len`` in tokens.
        model_options: the model's ``options`` table.

    ``share_engine`` is True here: the tests that only use a running engine share one
    start per class and isolation mode (a worker process's start is most of each such
    test's time); the start/stop and dead-engine tests still start their own.
    """

    share_engine: ClassVar[bool] = True
    backend: ClassVar[str] = ""
    plugins: ClassVar[tuple[str, ...]] = ()
    probe_backend: ClassVar[str | None] = None
    max_model_len: ClassVar[int] = 256
    model_options: ClassVar[dict[str, Any]] = {}

    def backend_spec(self, name: str) -> BackendSpec:
        """The registered spec of backend ``name`` (with ``plugins`` enabled)."""
        return PluginHost(self.plugins).backends().get(name)

    @pytest.fixture
    def conformance_engine_factory(self, servehall_tiny_llama: Path) -> EngineFactory:
        """Unstarted engines of ``backend`` on the tiny Llama with ``model_options``."""
        model = ModelConfig(
            name="tiny",
            path=servehall_tiny_llama,
            backend=self.backend,
            max_model_len=self.max_model_len,
            options=dict(self.model_options),
        )
        spec = self.backend_spec(self.backend)
        return lambda: spec.factory(model)

    @pytest.fixture
    def conformance_worker_model(self, servehall_tiny_llama: Path) -> WorkerModel:
        """The same model and backend, for the ``process`` runs."""
        model = ModelConfig(
            name="tiny",
            path=servehall_tiny_llama,
            backend=self.backend,
            max_model_len=self.max_model_len,
            options=dict(self.model_options),
        )
        return tuple(self.plugins), model

    @pytest.fixture
    def conformance_backend_spec(self) -> BackendSpec:
        """The spec of ``probe_backend`` (default ``backend``), for the probe test."""
        return self.backend_spec(self.probe_backend or self.backend)
