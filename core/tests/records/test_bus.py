"""``servehall.records.bus``: prompt text kept or dropped before any sink sees it, audit
times, admission refused (503) and readiness lost while a required sink cannot record,
the startup audit events (secrets masked, a stable digest), and ``open_record_bus``
building real sinks from ``[[sinks]]`` with one-line config errors."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from servehall import hookimpl
from servehall.config.settings import load_settings
from servehall.errors import ConfigError, ServiceUnavailableError
from servehall.plugin.manager import PluginHost
from servehall.records.bus import RecordBus, config_digest, open_record_bus, startup_events
from servehall.records.runner import FAIL_CLOSED_CODE, SinkRunner
from servehall.records.types import AuditEvent, Record, RequestRecord, SinkSpec


class MemorySink:
    """Keeps what it is given; ``up = False`` makes every write fail."""

    def __init__(self, name: str = "mem") -> None:
        self.name = name
        self.required = False
        self.up = True
        self.got: list[Record] = []

    async def start(self) -> None:
        pass

    async def write(self, records: Sequence[Record]) -> None:
        if not self.up:
            raise ConnectionError("storage is down")
        self.got.extend(records)

    async def close(self) -> None:
        pass


def _rec(i: int, **kw: Any) -> RequestRecord:
    return RequestRecord(request_id=f"r{i}", received_at=datetime.now(UTC), **kw)


async def _runner(sink: MemorySink, tmp_path: Path, **kw: Any) -> SinkRunner:
    r = SinkRunner(sink, spill_path=tmp_path / f"{sink.name}.spill", linger_s=0.001, **kw)
    await r.start()
    return r


async def _until(cond: Any) -> None:
    for _ in range(500):
        if cond():
            return
        await asyncio.sleep(0.005)
    raise AssertionError("condition not reached")


@pytest.mark.parametrize(
    ("bus_default", "own", "kept"),
    [(False, None, False), (True, None, True), (True, False, False), (False, True, True)],
)
async def test_prompt_text_kept_only_when_allowed(
    tmp_path: Path, bus_default: bool, own: bool | None, kept: bool
) -> None:
    sink = MemorySink()
    bus = RecordBus([await _runner(sink, tmp_path)], store_prompts=bus_default)
    bus.emit(_rec(1, prompt_text="secret", completion_text="answer", store_prompts=own))
    await bus.close()
    [got] = sink.got
    assert isinstance(got, RequestRecord)
    assert (got.prompt_text, got.completion_text) == (
        ("secret", "answer") if kept else (None, None)
    )
    assert bus.emitted == 1


async def test_audit_time_defaults_to_now_and_fans_out(tmp_path: Path) -> None:
    a, b = MemorySink("a"), MemorySink("b")
    bus = RecordBus([await _runner(a, tmp_path), await _runner(b, tmp_path)])
    given = datetime(2026, 1, 1, tzinfo=UTC)
    bus.audit(AuditEvent("key.created"))
    bus.audit(AuditEvent("key.revoked", at=given))
    await bus.close()
    assert [e.action for e in a.got] == ["key.created", "key.revoked"]  # type: ignore[union-attr]
    assert [e.action for e in b.got] == ["key.created", "key.revoked"]  # type: ignore[union-attr]
    first, second = a.got
    assert isinstance(first, AuditEvent) and first.at is not None and first.at.tzinfo is not None
    assert isinstance(second, AuditEvent) and second.at == given


async def test_an_empty_bus_keeps_nothing_and_is_healthy() -> None:
    bus = RecordBus()
    bus.emit(_rec(1))
    bus.check_admission()
    assert bus.healthy and bus.unready_sinks() == {} and bus.stats() == []
    assert not bus.commit_wait
    await bus.wait_written(_rec(1))
    await bus.close()


async def test_a_required_sink_that_fails_at_once_refuses_admission(tmp_path: Path) -> None:
    required, optional = MemorySink("req"), MemorySink("opt")
    bus = RecordBus(
        [
            await _runner(
                required, tmp_path, required=True, fail_closed="at_once", retry_after_s=9
            ),
            await _runner(optional, tmp_path),
        ]
    )
    required.up = False
    optional.up = False
    bus.emit(_rec(1))
    await _until(lambda: not bus.healthy)
    assert bus.unready_sinks() == {"req": "sink cannot write: ConnectionError: storage is down"}
    with pytest.raises(ServiceUnavailableError) as info:
        bus.check_admission()
    assert info.value.code == FAIL_CLOSED_CODE and info.value.headers == {"Retry-After": "9"}
    assert "'req'" in info.value.message and "fails closed at once" in info.value.message
    required.up = True
    optional.up = True
    await _until(lambda: bus.healthy)
    bus.check_admission()
    await bus.close()
    assert [r.request_id for r in required.got] == ["r1"]  # type: ignore[union-attr]


async def test_a_required_sink_refuses_once_exhausted(tmp_path: Path) -> None:
    sink = MemorySink("req")
    bus = RecordBus([await _runner(sink, tmp_path, required=True, buffer=2, spill=False)])
    sink.up = False
    for i in range(5):
        bus.emit(_rec(i))
    await _until(lambda: "req" in bus.unready_sinks())
    with pytest.raises(ServiceUnavailableError, match="its buffer is full"):
        bus.check_admission()
    sink.up = True
    await _until(lambda: bus.healthy)
    await bus.close()


def test_config_digest_is_canonical() -> None:
    assert config_digest({"b": 1, "a": [1, 2]}) == config_digest({"a": [1, 2], "b": 1})
    assert config_digest({"a": 1}) != config_digest({"a": 2})
    assert len(config_digest({})) == 64


def test_startup_events_mask_secrets() -> None:
    settings = load_settings(
        data={"database": {"url": "postgresql+asyncpg://u:hunter2@db/x"}, "sinks": []}
    )
    config, plugins = startup_events(settings, PluginHost([]))
    assert (config.action, plugins.action) == ("config.loaded", "plugins.loaded")
    assert "hunter2" not in json.dumps(config.details, default=str)
    assert config.details["sha256"] == config_digest(config.details["config"])
    assert plugins.details["enabled"] == []
    assert all(p["name"] for p in plugins.details["loaded"])


async def test_open_record_bus_with_a_jsonl_sink(tmp_path: Path) -> None:
    out = tmp_path / "records.jsonl"
    settings = load_settings(
        data={
            "sinks": [
                {
                    "name": "jsonl",
                    "required": True,
                    "options": {"path": str(out), "spill_path": str(tmp_path / "s.jsonl")},
                }
            ]
        }
    )
    bus = await open_record_bus(settings, PluginHost([]))
    assert [r.required for r in bus.runners] == [True]
    bus.emit(_rec(7, endpoint="/v1/completions"))
    await bus.close()
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    kinds = [line.get("action") or line.get("request_id") for line in lines]
    assert kinds == ["config.loaded", "plugins.loaded", "r7"]


async def test_open_record_bus_without_startup_audit(tmp_path: Path) -> None:
    out = tmp_path / "records.jsonl"
    settings = load_settings(
        data={
            "sinks": [
                {"name": "jsonl", "options": {"path": str(out), "spill_path": str(tmp_path / "s")}}
            ]
        }
    )
    bus = await open_record_bus(settings, PluginHost([]), startup_audit=False)
    await bus.close()
    assert not out.exists() or out.read_text() == ""


class BadSinks:
    @hookimpl
    def servehall_register_sinks(self, registry: Any) -> None:
        def crash(options: dict[str, Any], settings: Any) -> Any:
            raise RuntimeError("no driver")

        class WontStart(MemorySink):
            async def start(self) -> None:
                raise OSError("port closed")

        registry.add(SinkSpec("crash", crash))
        registry.add(SinkSpec("wontstart", lambda options, settings: WontStart()))


@pytest.mark.parametrize(
    ("sink", "message"),
    [
        (
            {"name": "jsonl", "options": {"colour": "red"}},
            "sinks[0] (jsonl).options: jsonl sink: unknown option(s) colour",
        ),
        (
            {"name": "jsonl", "options": {"fail_closed": "never"}},
            "sinks[0] (jsonl).options: fail_closed must be one of",
        ),
        ({"name": "crash"}, "sinks[0] (crash): no driver"),
        ({"name": "wontstart"}, "sinks[0] (wontstart): cannot start: OSError: port closed"),
    ],
)
async def test_open_record_bus_config_errors(
    tmp_path: Path, sink: dict[str, Any], message: str
) -> None:
    sink = {**sink, "options": {"spill_path": str(tmp_path / "s"), **sink.get("options", {})}}
    settings = load_settings(data={"sinks": [sink]})
    with pytest.raises(ConfigError) as info:
        await open_record_bus(settings, PluginHost([], extra=[("bad", BadSinks())]))
    assert info.value.message.startswith(message), info.value.message


def test_unknown_sink_name_is_a_config_error() -> None:
    settings = load_settings(data={"sinks": [{"name": "kafka"}]})
    with pytest.raises(ConfigError, match="kafka"):
        asyncio.run(open_record_bus(settings, PluginHost([])))
