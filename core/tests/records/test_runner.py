"""The sink runner and record bus: batching, retry, spill + in-order replay, fail-closed
admission, leftovers saved at close, and the ``jsonl`` sink."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

import pytest

from servehall import AuditEvent, RequestRecord, ServiceUnavailableError
from servehall.config.settings import load_settings
from servehall.plugin.manager import PluginHost
from servehall.records.bus import RecordBus, open_record_bus
from servehall.records.jsonl_sink import JsonlSink
from servehall.records.runner import SinkRunner
from servehall.records.types import Record


class SwitchableSink:
    """An in-process sink whose storage can be switched off (an outage)."""

    def __init__(self) -> None:
        self.name = "switch"
        self.required = False
        self.up = True
        self.rows: list[str] = []
        self.batches: list[int] = []
        self.write_s = 0.0  # how long a write takes (a transaction's round trips)

    async def start(self) -> None:
        pass

    async def write(self, records: Sequence[Record]) -> None:
        await asyncio.sleep(self.write_s)
        if not self.up:
            raise ConnectionError("storage is down")
        self.batches.append(len(records))
        for r in records:
            self.rows.append(r.request_id if isinstance(r, RequestRecord) else r.action)

    async def close(self) -> None:
        pass


def rec(i: int) -> RequestRecord:
    return RequestRecord(
        request_id=f"r{i}",
        received_at=datetime.now(UTC),
        endpoint="/v1/completions",
        status_code=200,
    )


async def wait_for(cond, timeout: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not cond():
        if loop.time() > end:
            raise AssertionError("condition not reached")
        await asyncio.sleep(0.01)


def runner(sink: SwitchableSink, tmp_path: Path, **kw: object) -> SinkRunner:
    opts: dict[str, object] = {
        "buffer": 10,
        "batch_size": 4,
        "linger_s": 0.0,
        "retry_initial_s": 0.01,
        "retry_max_s": 0.02,
        "spill_path": tmp_path / "spill.jsonl",
        "close_timeout_s": 0.5,
    }
    opts.update(kw)
    return SinkRunner(sink, **opts)  # type: ignore[arg-type]


async def test_batches_and_order(tmp_path: Path):
    sink = SwitchableSink()
    r = runner(sink, tmp_path, linger_s=0.05, batch_size=100)
    await r.start()
    for i in range(50):
        r.put(rec(i))
    await wait_for(lambda: len(sink.rows) == 50)
    await r.close()
    assert sink.rows == [f"r{i}" for i in range(50)]
    assert len(sink.batches) < 5  # batched, not one write per record


async def test_steady_load_is_written_in_groups_not_one_transaction_each(tmp_path: Path):
    """Records arriving one per millisecond, each write taking 5 ms: after every batch
    smaller than ``batch_size`` the runner lingers again (group commit). Without that,
    records that arrived during a write are written at once, a few per transaction,
    since the queue is never empty for the wake-up linger to apply."""
    sink = SwitchableSink()
    sink.write_s = 0.005
    r = runner(sink, tmp_path, buffer=1000, linger_s=0.02, batch_size=500)
    await r.start()
    start = time.monotonic()
    for i in range(300):
        r.put(rec(i))
        await asyncio.sleep(0.001)
    elapsed = time.monotonic() - start  # ~0.3 s; longer when the machine is loaded
    await wait_for(lambda: len(sink.rows) == 300)
    await r.close()
    assert sink.rows == [f"r{i}" for i in range(300)]
    # at least ~25 ms per round (20 ms linger + the write): about a dozen writes over
    # 0.3 s; one write per 5 ms write time (no linger between back-to-back batches)
    # would be elapsed / 5 ms, 60 or more
    assert len(sink.batches) <= elapsed / 0.02 + 2, (elapsed, sink.batches)


async def test_close_cuts_a_linger_short_and_writes_everything(tmp_path: Path):
    """A long ``linger_s`` (60 s) must not hold ``close()`` for its ``close_timeout_s``:
    the linger ends at once and the records are written."""
    sink = SwitchableSink()
    r = runner(sink, tmp_path, linger_s=60.0, batch_size=500, close_timeout_s=10.0)
    await r.start()
    r.put(rec(0))
    await asyncio.sleep(0.05)  # the runner is lingering after the wake-up
    t0 = time.monotonic()
    await r.close()
    assert time.monotonic() - t0 < 3.0
    assert sink.rows == ["r0"]
    assert not (tmp_path / "spill.jsonl").exists()


async def test_no_group_commit_when_responses_wait_for_their_records(tmp_path: Path):
    """With ``commit_wait_s`` set a response waits for its record, so the runner writes
    what is queued at once instead of lingering after a small write."""
    sink = SwitchableSink()
    r = runner(sink, tmp_path, linger_s=0.5, batch_size=500, commit_wait_s=5.0)
    assert not r._group_commit(1)
    r2 = runner(sink, tmp_path / "b", linger_s=0.5, batch_size=500)
    assert r2._group_commit(1) and not r2._group_commit(500)


async def test_outage_spills_then_replays_in_order(tmp_path: Path):
    sink = SwitchableSink()
    r = runner(sink, tmp_path)
    await r.start()
    sink.up = False
    for i in range(40):  # 10 in memory, 30 spilled
        r.put(rec(i))
        await asyncio.sleep(0)
    assert (tmp_path / "spill.jsonl").exists()
    assert not r.exhausted and r.failures > 0
    sink.up = True
    for i in range(40, 45):  # arrive during replay: must come after the spilled ones
        r.put(rec(i))
    await wait_for(lambda: len(sink.rows) == 45)
    assert sink.rows == [f"r{i}" for i in range(45)]
    await wait_for(lambda: not (tmp_path / "spill.jsonl").exists())
    r.put(rec(45))  # back to memory buffering
    await wait_for(lambda: len(sink.rows) == 46)
    await r.close()


async def test_required_sink_fails_closed_and_keeps_answered_records(tmp_path: Path):
    sink = SwitchableSink()
    r = runner(sink, tmp_path, required=True, spill=False, retry_after_s=7)
    await r.start()
    bus = RecordBus([r])
    sink.up = False
    for i in range(10):
        bus.check_admission()
        bus.emit(rec(i))
    with pytest.raises(ServiceUnavailableError) as info:
        bus.check_admission()
    assert info.value.status == 503 and info.value.headers["Retry-After"] == "7"
    assert info.value.code == "records_unavailable"
    for i in range(10, 15):  # admitted earlier, answered now: never dropped
        bus.emit(rec(i))
    assert r.dropped == 0
    sink.up = True
    await wait_for(lambda: len(sink.rows) == 15)
    bus.check_admission()  # admits again
    assert sink.rows == [f"r{i}" for i in range(15)]
    await bus.close()


def refusal(i: int) -> RequestRecord:
    r = rec(i)
    r.status_code = 503
    r.error_code = "records_unavailable"
    return r


async def test_refusals_are_records_too(tmp_path: Path):
    """P03: every 503 records_unavailable is kept (beyond the buffer) and written later."""
    sink = SwitchableSink()
    r = runner(sink, tmp_path, required=True, spill=False, buffer=3)
    await r.start()
    bus = RecordBus([r])
    sink.up = False
    for i in range(3):
        bus.check_admission()
        bus.emit(rec(i))
    await wait_for(lambda: r.failures > 0)
    assert bus.unready_sinks() == {"switch": "sink cannot write: ConnectionError: storage is down"}
    for i in range(3, 30):
        with pytest.raises(ServiceUnavailableError):
            bus.check_admission()
        bus.emit(refusal(i))
    assert r.dropped == 0
    sink.up = True
    await wait_for(lambda: len(sink.rows) == 30)
    assert sink.rows == [f"r{i}" for i in range(30)]
    assert bus.unready_sinks() == {}
    bus.check_admission()
    await bus.close()


async def test_refusals_beyond_max_refused_are_counted(tmp_path: Path):
    sink = SwitchableSink()
    r = runner(sink, tmp_path, required=True, spill=False, buffer=2, max_refused=5)
    await r.start()
    sink.up = False
    for i in range(2):
        r.put(rec(i))
    for i in range(2, 12):
        r.put(refusal(i))
    r.put(rec(12))  # an admitted request's record is never dropped
    assert r.dropped == 5
    sink.up = True
    await wait_for(lambda: len(sink.rows) == 8)
    assert sink.rows == ["r0", "r1", "r2", "r3", "r4", "r5", "r6", "r12"]
    await r.close()


async def test_fail_closed_at_once(tmp_path: Path):
    """``fail_closed = "at_once"``: refuse from the first failed write, admit after a
    successful one, with room left in the buffer all along."""
    sink = SwitchableSink()
    r = runner(sink, tmp_path, required=True, fail_closed="at_once", buffer=1000)
    await r.start()
    bus = RecordBus([r])
    bus.check_admission()
    sink.up = False
    bus.emit(rec(0))
    await wait_for(lambda: r.failures > 0)
    assert not r.exhausted
    with pytest.raises(ServiceUnavailableError) as info:
        bus.check_admission()
    assert "fails closed at once" in info.value.message
    bus.emit(refusal(1))
    sink.up = True
    await wait_for(lambda: len(sink.rows) == 2)
    bus.check_admission()
    await bus.close()


def test_fail_closed_option_is_checked(tmp_path: Path):
    with pytest.raises(ValueError, match="fail_closed"):
        runner(SwitchableSink(), tmp_path, fail_closed="sometimes")


async def test_optional_sink_drops_and_counts_when_exhausted(tmp_path: Path):
    sink = SwitchableSink()
    r = runner(sink, tmp_path, spill=False)
    await r.start()
    sink.up = False
    for i in range(15):
        r.put(rec(i))
    assert r.dropped == 5 and r.exhausted
    RecordBus([r]).check_admission()  # not required: still admits
    sink.up = True
    await wait_for(lambda: len(sink.rows) == 10)
    await r.close()


async def test_close_saves_leftovers_and_next_start_replays(tmp_path: Path):
    sink = SwitchableSink()
    r = runner(sink, tmp_path)
    await r.start()
    sink.up = False
    for i in range(25):
        r.put(rec(i))
    r.put(AuditEvent(action="key.revoked", at=datetime.now(UTC)))
    await r.close()
    lines = (tmp_path / "spill.jsonl").read_text().splitlines()
    assert len(lines) == 26 and json.loads(lines[0])["request_id"] == "r0"
    sink2 = SwitchableSink()
    r2 = runner(sink2, tmp_path)
    await r2.start()
    await wait_for(lambda: len(sink2.rows) == 26)
    assert sink2.rows == [*(f"r{i}" for i in range(25)), "key.revoked"]
    await wait_for(lambda: not (tmp_path / "spill.jsonl").exists())
    await r2.close()


async def test_jsonl_sink_from_config(tmp_path: Path):
    out = tmp_path / "logs" / "records.jsonl"
    settings = load_settings(
        data={"sinks": [{"name": "jsonl", "options": {"path": str(out), "linger_s": 0}}]}
    )
    bus = await open_record_bus(settings, PluginHost([]))
    r = rec(1)
    r.prompt_text = "not stored by default"
    r.principal_id = "key-ab12"
    bus.emit(r)
    await bus.close()
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert [x["type"] for x in lines] == ["audit", "audit", "request"]
    assert lines[0]["action"] == "config.loaded"
    assert lines[2]["request_id"] == "r1" and lines[2]["prompt_text"] is None
    assert lines[2]["received_at"].endswith("Z")


async def test_jsonl_sink_stdout(capsys: pytest.CaptureFixture[str]):
    sink = JsonlSink("-")
    await sink.start()
    await sink.write([rec(7)])
    await sink.close()
    assert json.loads(capsys.readouterr().out)["request_id"] == "r7"


async def test_unknown_sink_is_a_config_error():
    from servehall import ConfigError

    settings = load_settings(data={"sinks": [{"name": "kafka"}]})
    with pytest.raises(ConfigError, match="unknown sink 'kafka'"):
        await open_record_bus(settings, PluginHost([]))


async def test_cli_bus_without_startup_events(tmp_path: Path):
    out = tmp_path / "cli.jsonl"
    settings = load_settings(data={"sinks": [{"name": "jsonl", "options": {"path": str(out)}}]})
    bus = await open_record_bus(settings, PluginHost([]), startup_audit=False)
    bus.audit(
        AuditEvent(
            action="key.created",
            actor="cli:ops",
            target="key-1",
            details={"secret": "sk-x", "scopes": ["inference"]},
        )
    )
    await bus.close()
    (line,) = [json.loads(x) for x in out.read_text().splitlines()]
    assert line["action"] == "key.created" and line["details"]["secret"] == "**********"


async def test_startup_config_event_masks_every_secret(tmp_path: Path):
    out = tmp_path / "s.jsonl"
    settings = load_settings(
        data={
            "database": {"url": "postgresql+asyncpg://svc:db-pass-canary@db:5432/x"},
            "sinks": [
                {
                    "name": "jsonl",
                    "options": {"path": str(out)},
                }
            ],
            "vault": {"mirror": "postgresql://svc:url-pass-canary@db/x", "token": "tok-canary"},
        }
    )
    bus = await open_record_bus(settings, PluginHost([]))
    await bus.close()
    text = out.read_text()
    assert "config.loaded" in text
    for canary in ("db-pass-canary", "url-pass-canary", "tok-canary"):
        assert canary not in text


async def test_unknown_sink_option_is_a_config_error(tmp_path: Path):
    from servehall import ConfigError

    settings = load_settings(data={"sinks": [{"name": "jsonl", "options": {"pth": "x"}}]})
    with pytest.raises(ConfigError, match="pth"):
        await open_record_bus(settings, PluginHost([]))


async def test_spill_limit_then_tail_keeps_order(tmp_path: Path):
    sink = SwitchableSink()
    r = runner(sink, tmp_path, required=True, spill_max_bytes=2000)
    await r.start()
    sink.up = False
    i = 0
    while not r.exhausted:
        r.put(rec(i))
        i += 1
        assert i < 100
    assert (tmp_path / "spill.jsonl").stat().st_size >= 2000
    for j in range(i, i + 5):  # answered while exhausted: kept in the tail, in order
        r.put(rec(j))
    assert r.dropped == 0
    sink.up = True
    await wait_for(lambda: len(sink.rows) == i + 5)
    assert sink.rows == [f"r{k}" for k in range(i + 5)]
    assert not r.exhausted
    await r.close()


async def test_idle_check_sees_an_outage_without_traffic(tmp_path: Path):
    """No record waits; the sink's ``check()`` fails: the runner turns unhealthy with the
    check's error (readiness of a required sink, ``at_once`` refusal), and healthy again
    once a check passes. Without ``check_interval_s`` nothing is probed."""

    class CheckedSink(SwitchableSink):
        checks = 0

        async def check(self) -> None:
            self.checks += 1
            if not self.up:
                raise ConnectionError("storage is down")

    sink = CheckedSink()
    r = runner(sink, tmp_path, required=True, fail_closed="at_once", check_interval_s=0.05)
    await r.start()
    r.put(rec(0))
    await wait_for(lambda: sink.rows == ["r0"])
    sink.up = False
    await wait_for(lambda: not r.healthy)
    assert r.refusing and r.checks_failed >= 1
    assert r.last_error == "ConnectionError: storage is down"
    sink.up = True
    await wait_for(lambda: r.healthy)
    assert not r.refusing
    r.put(rec(1))
    await wait_for(lambda: sink.rows == ["r0", "r1"])
    await r.close()

    quiet = CheckedSink()
    r2 = runner(quiet, tmp_path / "b", check_interval_s=0)
    await r2.start()
    await asyncio.sleep(0.2)
    await r2.close()
    assert quiet.checks == 0


async def test_a_hanging_write_fails_closed_after_write_timeout(tmp_path: Path) -> None:
    """A write that neither succeeds nor fails (a database that stopped answering):
    after ``write_timeout_s`` the required sink is unhealthy and ``at_once`` refuses;
    the write is not cancelled — when it completes, each record is written once and the
    sink is healthy again."""
    sink = SwitchableSink()
    sink.write_s = 1.5
    r = SinkRunner(
        sink,
        required=True,
        fail_closed="at_once",
        write_timeout_s=0.3,
        check_interval_s=0,
        linger_s=0,
        spill=False,
    )
    await r.start()
    try:
        t0 = time.monotonic()
        r.put(rec(1))
        await wait_for(lambda: not r.healthy, timeout=5)
        assert 0.25 < time.monotonic() - t0 < 1.4  # the timeout acted, not the write
        assert r.refusing and r.write_timeouts == 1 and "write_timeout_s" in str(r.last_error)
        await wait_for(lambda: r.written == 1, timeout=5)
        assert r.healthy and not r.refusing
        assert sink.rows == ["r1"] and r.failures == 0
    finally:
        await r.close()
