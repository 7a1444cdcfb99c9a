"""The scrape-time collectors of ``GET /metrics`` (servehall.metrics_scrape): what is read
from a host when Prometheus scrapes — each model's engine stats, scheduler queues, model
states, supervision and device figures, the endpoint picker's replica-wide series, the
record sinks (a real jsonl sink) and the config digest. Exposition text is parsed back
with prometheus_client's own parser."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

sys.path.insert(0, str(Path(__file__).parent))
from api_fixtures import ScriptedEngine, make_host
from text_fixtures import build_tokenizer

from servehall.engines.contract import (
    GRAMMAR_COMPILE_BUCKETS,
    EngineStats,
    GrammarStats,
    ModelInfo,
    SpecDecodeStats,
)
from servehall.metrics import MODEL_STATES
from servehall.metrics_scrape import config_digest, host_collectors
from servehall.plugin.host import Host

Samples = dict[str, list[tuple[dict[str, str], float]]]


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tokenizer(tmp_path_factory.mktemp("tok"))


class ReportingEngine(ScriptedEngine):
    """A scripted engine whose ``stats()`` and supervision attributes are set by the test
    (what a ProcessEngine or a vLLM engine reports)."""

    def __init__(self, stats: EngineStats, **attrs: Any) -> None:
        super().__init__([5], supported=attrs.pop("supported", ("seed",)))
        self._stats = stats
        extra = attrs.pop("extra", {})
        self._info = ModelInfo(max_model_len=256, extra=extra)
        for key, value in attrs.items():
            setattr(self, key, value)

    def stats(self) -> EngineStats:
        return self._stats


class BrokenStatsEngine(ScriptedEngine):
    def stats(self) -> EngineStats:
        raise RuntimeError("the worker is gone")


def scrape(host: Host | None) -> Samples:
    """Every sample the host's collectors export, by sample name."""
    registry = CollectorRegistry(auto_describe=True)
    for collector in host_collectors(lambda: host):
        registry.register(collector)
    out: Samples = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for s in family.samples:
            out.setdefault(s.name, []).append((dict(s.labels), s.value))
    return out


def value(samples: Samples, name: str, **labels: str) -> float:
    """The one sample of ``name`` whose labels include ``labels``."""
    found = [v for lab, v in samples.get(name, []) if labels.items() <= lab.items()]
    assert len(found) == 1, (name, labels, samples.get(name))
    return found[0]


def test_no_host_yet_exports_the_replica_series_at_zero_and_no_model() -> None:
    s = scrape(None)
    assert value(s, "servehall_replica_requests_running") == 0
    assert value(s, "servehall_replica_requests_waiting") == 0
    assert value(s, "servehall_replica_kv_cache_usage_ratio") == 0
    assert "servehall_requests_running" not in s
    assert "servehall_config_info" not in s  # no host, no digest


def test_engine_stats_queues_and_model_state(tok_dir: Path) -> None:
    stats = EngineStats(running=3, waiting=2, kv_cache_blocks_used=16, kv_cache_blocks_total=64)
    host = make_host(tok_dir, ReportingEngine(stats, extra={"kv_block_size": 16}))
    served = host.models["m"]
    served.loads, served.last_load_s, served.state = 2, 1.5, "draining"
    s = scrape(host)
    m = {"model": "m", "version": ""}
    assert value(s, "servehall_requests_running", **m) == 3
    assert value(s, "servehall_requests_waiting", **m) == 2  # + 0 in the admission queue
    assert value(s, "servehall_kv_cache_usage_ratio", **m) == 0.25
    assert value(s, "servehall_kv_cache_blocks_used", **m) == 16
    assert value(s, "servehall_model_loads_total", **m) == 2
    assert value(s, "servehall_model_load_seconds", **m) == 1.5
    states = {lab["state"]: v for lab, v in s["servehall_model_state"]}
    assert states == {st: 1.0 if st == "draining" else 0.0 for st in MODEL_STATES}
    # the picker's replica-wide series and the cache geometry
    assert value(s, "servehall_replica_requests_running") == 3
    assert value(s, "servehall_replica_requests_waiting") == 2
    assert value(s, "servehall_replica_kv_cache_usage_ratio") == 0.25
    info = s["servehall_cache_config_info"]
    assert info == [({**m, "block_size": "16", "num_gpu_blocks": "64"}, 1.0)]
    # an in-process engine has no worker: no up/restart series, no grammar families
    assert "servehall_engine_up" not in s and "servehall_engine_restarts_total" not in s
    assert "servehall_grammar_cache_hits_total" not in s


def test_the_replica_series_add_up_models_and_take_the_fullest_cache(tok_dir: Path) -> None:
    from servehall.plugin.host import ServedModel
    from servehall.schedulers.fcfs import FcfsScheduler

    host = make_host(tok_dir, ReportingEngine(EngineStats(1, 4, 8, 10)))
    other = ReportingEngine(EngineStats(2, 1, 1, 100))
    host.models["small"] = ServedModel(
        name="small",
        backend="scripted",
        engine=other,  # type: ignore[arg-type]
        scheduler=FcfsScheduler(host.settings.scheduler),
        tokenizer=host.models["m"].tokenizer,
        max_model_len=256,
        version="v2",
    )
    s = scrape(host)
    assert value(s, "servehall_replica_requests_running") == 3
    assert value(s, "servehall_replica_requests_waiting") == 5
    assert value(s, "servehall_replica_kv_cache_usage_ratio") == 0.8
    assert value(s, "servehall_requests_running", model="small", version="v2") == 2
    blocks = {lab["model"]: lab["block_size"] for lab, _ in s["servehall_cache_config_info"]}
    assert blocks == {"m": "", "small": ""}  # no kv_block_size in model_info.extra


def test_one_failing_engine_does_not_fail_the_scrape(tok_dir: Path) -> None:
    host = make_host(tok_dir, BrokenStatsEngine([5]))
    host.models["m"].loads = 1
    s = scrape(host)
    # what does not need stats() is still there; the stats families are empty
    assert value(s, "servehall_model_loads_total", model="m") == 1
    assert "servehall_requests_running" not in s
    assert value(s, "servehall_replica_requests_running") == 0


def test_supervision_devices_prefix_cache_and_speculative_decoding(tok_dir: Path) -> None:
    stats = EngineStats(
        running=1,
        waiting=0,
        kv_cache_blocks_used=1,
        kv_cache_blocks_total=4,
        prefix_cache_queries=100,
        prefix_cache_hits=None,
        devices=(("cuda:0", 10, 80), ("cuda:1", 20, 80)),
        spec_decode=SpecDecodeStats(
            drafts=5, draft_tokens=None, accepted_tokens=7, accepted_per_position=(4, 3)
        ),
    )
    engine = ReportingEngine(
        stats,
        restart_counts={"oom": 1, "crash": 2},
        worker_up=False,
        started_at=1700000000.5,
        last_exit_reason="oom",
        oom_kills=1,
        busy_silences=3,
        crash_looping=True,
    )
    s = scrape(make_host(tok_dir, engine))
    m = {"model": "m", "version": ""}
    assert value(s, "servehall_engine_up", **m) == 0
    assert value(s, "servehall_engine_restarts_total", **m, reason="crash") == 2
    assert value(s, "servehall_engine_restarts_total", **m, reason="oom") == 1
    assert value(s, "servehall_engine_start_time_seconds", **m) == 1700000000.5
    assert s["servehall_engine_last_exit"] == [({**m, "reason": "oom"}, 1.0)]
    assert value(s, "servehall_engine_oom_kills_total", **m) == 1
    assert value(s, "servehall_engine_busy_silences_total", **m) == 3
    assert value(s, "servehall_engine_crash_loop", **m) == 1
    assert value(s, "servehall_device_memory_used_bytes", **m, device="cuda:1") == 20
    assert value(s, "servehall_device_memory_total_bytes", **m, device="cuda:0") == 80
    assert value(s, "servehall_prefix_cache_queries_total", **m) == 100
    assert value(s, "servehall_prefix_cache_hits_total", **m) == 0  # None reads as 0
    assert value(s, "servehall_spec_decode_num_drafts_total", **m) == 5
    assert "servehall_spec_decode_num_draft_tokens_total" not in s  # the engine cannot tell
    assert value(s, "servehall_spec_decode_num_accepted_tokens_total", **m) == 7
    per_pos = s["servehall_spec_decode_num_accepted_tokens_per_pos_total"]
    assert sorted((lab["position"], v) for lab, v in per_pos) == [("0", 4.0), ("1", 3.0)]


def test_one_device_pair_is_labelled_with_the_engines_device(tok_dir: Path) -> None:
    stats = EngineStats(0, 0, 0, 4, device_memory_used_bytes=None, device_memory_total_bytes=64)
    s = scrape(make_host(tok_dir, ReportingEngine(stats, extra={"device": "xpu:0"})))
    assert value(s, "servehall_device_memory_total_bytes", device="xpu:0") == 64
    assert value(s, "servehall_device_memory_used_bytes", device="xpu:0") == 0
    # an engine that reports nothing of this gets none of these series
    bare = scrape(make_host(tok_dir, ReportingEngine(EngineStats(0, 0, 0, 4))))
    for name in (
        "servehall_device_memory_total_bytes",
        "servehall_prefix_cache_queries_total",
        "servehall_spec_decode_num_drafts_total",
        "servehall_engine_start_time_seconds",
        "servehall_engine_crash_loop",
    ):
        assert name not in bare, name


def test_grammar_compiles_are_a_histogram_for_structured_output_engines(tok_dir: Path) -> None:
    n = len(GRAMMAR_COMPILE_BUCKETS)
    grammar = GrammarStats(
        hits=9, misses=3, compile_seconds_sum=0.75, compile_buckets=(1,) * (n - 1) + (2,)
    )
    stats = EngineStats(0, 0, 0, 4, grammar=grammar)
    s = scrape(make_host(tok_dir, ReportingEngine(stats, supported=("structured_output",))))
    assert value(s, "servehall_grammar_cache_hits_total", model="m") == 9
    assert value(s, "servehall_grammar_compile_seconds_sum", model="m") == 0.75
    assert value(s, "servehall_grammar_compile_seconds_count", model="m") == 3
    buckets = {lab["le"]: v for lab, v in s["servehall_grammar_compile_seconds_bucket"]}
    assert buckets["+Inf"] == 3
    assert buckets[repr(float(GRAMMAR_COMPILE_BUCKETS[-1]))] == 2
    assert len(buckets) == n + 1
    # an engine that has compiled nothing yet still exports the zero histogram
    idle = EngineStats(0, 0, 0, 4)
    s = scrape(make_host(tok_dir, ReportingEngine(idle, supported=("structured_output",))))
    zero = {lab["le"]: v for lab, v in s["servehall_grammar_compile_seconds_bucket"]}
    assert set(zero.values()) == {0.0} and len(zero) == n + 1


async def test_sinks_and_config_digest_from_a_real_record_bus(
    tok_dir: Path, tmp_path: Path
) -> None:
    from servehall.config.settings import load_settings
    from servehall.plugin.manager import PluginHost
    from servehall.records.bus import open_record_bus

    out = tmp_path / "records.jsonl"
    settings = load_settings(
        data={"sinks": [{"name": "jsonl", "required": True, "options": {"path": str(out)}}]}
    )
    host = make_host(tok_dir, ReportingEngine(EngineStats(0, 0, 0, 4)))
    host.settings = settings
    bus = await open_record_bus(settings, PluginHost([]))
    host.records = bus  # type: ignore[assignment]
    try:
        s = scrape(host)
    finally:
        await bus.close()
    assert value(s, "servehall_sink_up", sink="jsonl", required="true") == 1
    assert value(s, "servehall_sink_refusing", sink="jsonl") == 0
    assert value(s, "servehall_sink_write_failures_total", sink="jsonl") == 0
    assert value(s, "servehall_sink_dropped_records_total", sink="jsonl") == 0
    assert value(s, "servehall_records_rejected_total", sink="jsonl") == 0
    assert "sink" in s["servehall_sink_queued_records"][0][0]
    digest = config_digest(host)
    assert len(digest) == 64 and int(digest, 16) >= 0
    assert s["servehall_config_info"] == [({"sha256": digest}, 1.0)]


def test_config_digest_masks_secrets_and_is_kept_per_host(tok_dir: Path) -> None:
    from servehall.config.settings import Settings

    def host(url: str) -> Host:
        return make_host(tok_dir, ScriptedEngine([5]), settings={"database": {"url": url}})

    pg = "postgresql+asyncpg://servehall:{}@db.internal:5432/servehall"
    a, b = host(pg.format("first-password")), host(pg.format("second-password"))
    # only the password is hidden before hashing: rotating it keeps the digest,
    # pointing records at another database changes it
    assert config_digest(a) == config_digest(b)
    assert config_digest(host(pg.replace("db.internal", "db2.internal"))) != config_digest(a)
    other = make_host(tok_dir, ScriptedEngine([5]), settings={"scheduler": {"max_concurrency": 3}})
    assert config_digest(other) != config_digest(a)
    # computed once: a later settings change does not move a host's digest
    first = config_digest(other)
    other.settings = Settings()
    assert config_digest(other) == first


async def test_the_admission_queue_per_tenant_adds_to_waiting(tok_dir: Path) -> None:
    import asyncio

    from servehall.admission.scheduler import Ticket

    stats = EngineStats(running=1, waiting=1, kv_cache_blocks_used=1, kv_cache_blocks_total=8)
    host = make_host(
        tok_dir, ReportingEngine(stats), settings={"scheduler": {"max_concurrency": 1}}
    )
    scheduler = host.models["m"].scheduler
    held = await scheduler.acquire(Ticket(request_id="a", model="m", tenant="gold"))
    queued = [
        asyncio.create_task(scheduler.acquire(Ticket(request_id=r, model="m", tenant=t)))
        for r, t in (("b", "gold"), ("c", "plain"), ("d", "plain"))
    ]
    await asyncio.sleep(0)
    try:
        s = scrape(host)
    finally:
        for task in queued:
            task.cancel()
        await asyncio.gather(*queued, return_exceptions=True)
        held.release()
    m = {"model": "m", "version": ""}
    assert value(s, "servehall_scheduler_queue", **m, tenant="gold") == 1
    assert value(s, "servehall_scheduler_queue", **m, tenant="plain") == 2
    assert value(s, "servehall_scheduler_service_tokens_total", **m, tenant="gold") >= 0
    # engine queue (1) plus admission queue (3), per model and for the replica
    assert value(s, "servehall_requests_waiting", **m) == 4
    assert value(s, "servehall_replica_requests_waiting") == 4
