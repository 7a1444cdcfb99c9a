"""The backend conformance kit itself (servehall.testing.conformance): its checks reject
streams, stats and engines that break the Engine contract (real ``null`` engines with one
fault each), pass the sound ``null`` engine, skip what a backend does not provide (no
probe spec, no worker model) and share one engine per class with ``share_engine``."""

from __future__ import annotations

import asyncio
import json
import random
import textwrap
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path

import pytest

from servehall.config.models import ModelConfig
from servehall.engines.backends import BackendSpec, ProbeResult
from servehall.engines.contract import EngineHealth, EngineStats, SamplingParams, TokenDelta
from servehall.engines.null import NullEngine, null_engine_factory
from servehall.testing.conformance import (
    BackendConformance,
    check_stats,
    check_stream_shape,
    collect,
    greedy,
    tokens_of,
)

pytest_plugins = ("pytester",)


def _model(tmp: Path) -> ModelConfig:
    d = tmp / "null-model"
    d.mkdir(exist_ok=True)
    cfg = {"vocab_size": 100, "max_position_embeddings": 512, "eos_token_id": 2}
    (d / "config.json").write_text(json.dumps(cfg))
    return ModelConfig(name="n", path=d, backend="null", options={"step_time_ms": 1})


def _kit() -> BackendConformance:
    kit = BackendConformance()
    kit.timeout_s = 5.0
    kit.kv_release_timeout_s = 0.5
    kit.long_tokens = 60
    return kit


# --- the helpers -------------------------------------------------------------------------


def test_stream_shape_needs_one_terminal_delta_last_and_tokens_before() -> None:
    check_stream_shape([TokenDelta((4,)), TokenDelta((5, 6), "length")])
    check_stream_shape([TokenDelta((), "abort")])  # an early end carries no token
    with pytest.raises(AssertionError, match="no delta at all"):
        check_stream_shape([])
    with pytest.raises(AssertionError, match="did not end with a finish_reason"):
        check_stream_shape([TokenDelta((4,)), TokenDelta((5,))])
    with pytest.raises(AssertionError, match="finish_reason before the end"):
        check_stream_shape([TokenDelta((4,), "stop"), TokenDelta((5,), "length")])
    with pytest.raises(AssertionError, match="empty non-terminal delta"):
        check_stream_shape([TokenDelta(()), TokenDelta((5,), "length")])


@pytest.mark.parametrize(
    "stats",
    [
        EngineStats(running=-1, waiting=0, kv_cache_blocks_used=0, kv_cache_blocks_total=4),
        EngineStats(running=0, waiting=0, kv_cache_blocks_used=0, kv_cache_blocks_total=0),
        EngineStats(running=1, waiting=0, kv_cache_blocks_used=5, kv_cache_blocks_total=4),
        EngineStats(0, 0, 0, 4, device_memory_used_bytes=-1),
        EngineStats(0, 0, 0, 4, device_memory_used_bytes=9, device_memory_total_bytes=8),
    ],
)
def test_insane_stats_are_refused(stats: EngineStats) -> None:
    with pytest.raises(AssertionError):
        check_stats(stats)


def test_sane_stats_and_the_small_helpers() -> None:
    check_stats(EngineStats(2, 1, 3, 4, device_memory_used_bytes=8, device_memory_total_bytes=8))
    check_stats(EngineStats(0, 0, 0, 1, device_memory_used_bytes=0))  # total unknown
    p = greedy(7)
    assert (p.max_tokens, p.temperature, p.ignore_eos) == (7, 0.0, True)
    assert tokens_of([TokenDelta((1, 2)), TokenDelta((), "abort"), TokenDelta((3,))]) == [1, 2, 3]


async def test_collect_ends_with_a_timeout_on_a_stream_that_never_ends() -> None:
    async def endless() -> AsyncIterator[TokenDelta]:
        while True:
            await asyncio.sleep(0.01)
            yield TokenDelta((1,))

    with pytest.raises(TimeoutError):
        await collect(endless(), 0.1)


def test_prompts_are_four_lengths_within_the_vocabulary(tmp_path: Path) -> None:
    engine = NullEngine(_model(tmp_path))
    prompts = _kit().prompts(engine)
    assert [len(p) for p in prompts] == [5, 11, 3, 17]
    assert all(3 <= t < 100 for p in prompts for t in p)
    assert len({tuple(p) for p in prompts}) == 4


# --- the suite on engines with one fault each --------------------------------------------


class RandomEngine(NullEngine):
    """Greedy output that is not a function of the prompt (a race in a sampler)."""

    def add_request(
        self, request_id: str, prompt_token_ids: Sequence[int], params: SamplingParams
    ) -> AsyncIterator[TokenDelta]:
        noise = [random.randrange(3, 100) for _ in range(8)]
        return super().add_request(request_id, noise, params)


class LeakyEngine(NullEngine):
    """Never gives back the KV blocks of an aborted request."""

    leaked = 0

    async def abort(self, request_id: str) -> None:
        if request_id in self._running:
            self.leaked += 1
        await super().abort(request_id)

    def stats(self) -> EngineStats:
        s = super().stats()
        return EngineStats(s.running, s.waiting, s.kv_cache_blocks_used + self.leaked, 256)


class ImmortalEngine(NullEngine):
    """Reports healthy even after shutdown."""

    async def health(self) -> EngineHealth:
        return EngineHealth(True)


class ReusedIdEngine(NullEngine):
    """Takes a second request under a live request's id."""

    def add_request(
        self, request_id: str, prompt_token_ids: Sequence[int], params: SamplingParams
    ) -> AsyncIterator[TokenDelta]:
        self._abort_now(request_id)
        return super().add_request(request_id, prompt_token_ids, params)


def _factory(cls: type[NullEngine], tmp: Path) -> Callable[[], NullEngine]:
    model = _model(tmp)
    return lambda: cls(model)


async def test_the_sound_null_engine_passes_the_checks_that_the_faults_fail(
    tmp_path: Path,
) -> None:
    kit, sound = _kit(), _factory(NullEngine, tmp_path)
    await kit.test_greedy_is_deterministic(sound)
    await kit.test_abort_ends_stream_and_frees_kv(sound)
    await kit.test_starts_and_stops_cleanly(sound)
    await kit.test_duplicate_request_id_rejected(sound)


async def test_nondeterministic_greedy_output_fails(tmp_path: Path) -> None:
    with pytest.raises(AssertionError):
        await _kit().test_greedy_is_deterministic(_factory(RandomEngine, tmp_path))


async def test_kv_blocks_kept_after_an_abort_fail(tmp_path: Path) -> None:
    with pytest.raises(AssertionError, match="KV blocks not released after abort"):
        await _kit().test_abort_ends_stream_and_frees_kv(_factory(LeakyEngine, tmp_path))


async def test_health_that_survives_shutdown_fails(tmp_path: Path) -> None:
    kit = _kit()
    kit.timeout_s = 0.5  # the dead-engine test waits this long for health to drop
    with pytest.raises(AssertionError):
        await kit.test_starts_and_stops_cleanly(_factory(ImmortalEngine, tmp_path))
    with pytest.raises(AssertionError, match="health still ok after the engine died"):
        await kit.test_health_reports_dead_engine(_factory(ImmortalEngine, tmp_path), None)


async def test_a_reused_live_request_id_fails(tmp_path: Path) -> None:
    with pytest.raises(pytest.fail.Exception, match="DID NOT RAISE"):
        await _kit().test_duplicate_request_id_rejected(_factory(ReusedIdEngine, tmp_path))


def test_the_probe_check(tmp_path: Path) -> None:
    kit = _kit()
    with pytest.raises(pytest.skip.Exception, match="no conformance_backend_spec"):
        kit.test_probe_never_raises(None)
    kit.test_probe_never_raises(
        BackendSpec("null", lambda: ProbeResult(True, "always"), null_engine_factory)
    )
    silent = BackendSpec("null", lambda: ProbeResult(False, "  "), null_engine_factory)
    with pytest.raises(AssertionError):
        kit.test_probe_never_raises(silent)


# --- the suite as pytest runs it: skips and a shared engine ------------------------------

_SUITE = """
import json
from pathlib import Path

import pytest

from servehall.config.models import ModelConfig
from servehall.engines.null import NullEngine
from servehall.testing.conformance import BackendConformance

BUILT = Path(__file__).with_name("built.txt")
ENGINES = []


@pytest.fixture(scope="module", autouse=True)
def every_engine_is_shut_down():
    yield  # after the class's own teardown: engines it shared are shut down by then
    live = [e for e in ENGINES if not e._stopped]
    Path(__file__).with_name("live.txt").write_text(str(len(live)))


class TestNull(BackendConformance):
    timeout_s = 10.0
    long_tokens = 60
    share_engine = SHARE

    @pytest.fixture
    def conformance_engine_factory(self, tmp_path):
        d = tmp_path / "m"
        d.mkdir()
        cfg = {"vocab_size": 100, "max_position_embeddings": 512, "eos_token_id": 2}
        (d / "config.json").write_text(json.dumps(cfg))
        model = ModelConfig(name="n", path=d, backend="null", options={"step_time_ms": 1})

        def build():
            with BUILT.open("a") as fh:
                fh.write("x")
            ENGINES.append(NullEngine(model))
            return ENGINES[-1]

        return build
"""

_INI = """
[pytest]
asyncio_mode = auto
asyncio_default_fixture_loop_scope = session
asyncio_default_test_loop_scope = session
"""


@pytest.mark.parametrize(("share", "builds"), [(False, 8), (True, 3)])
def test_process_runs_and_the_probe_skip_without_their_fixtures_and_engines_are_shared(
    pytester: pytest.Pytester, share: bool, builds: int
) -> None:
    pytester.makeini(_INI)
    pytester.makepyfile(test_suite=textwrap.dedent(_SUITE).replace("SHARE", str(share)))
    result = pytester.runpytest_inprocess(
        "-p", "no:cacheprovider", "-rs", "-W", "error::pytest.PytestRemovedIn10Warning"
    )
    # 8 engine tests x (thread, process) + the probe test; process runs and the probe skip
    result.assert_outcomes(passed=8, skipped=9)
    result.stdout.fnmatch_lines(
        [
            "*no conformance_backend_spec fixture*",
            "*no conformance_worker_model fixture: process mode not run*",
        ]
    )
    # the start/stop and dead-engine tests always start their own engine; the six others
    # start one each, or share one per class with share_engine
    assert len((pytester.path / "built.txt").read_text()) == builds
    assert (pytester.path / "live.txt").read_text() == "0"  # shared ones too, at class end
