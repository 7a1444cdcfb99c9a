"""The per-request state (:mod:`servehall.serving.request`): it reports through the
listeners it is handed — in their order, once — and the record emitter keeps a bus
that rejects a record from breaking the response."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any

import pytest

from servehall.config.settings import Settings
from servehall.plugin.host import Host
from servehall.plugin.manager import PluginHost
from servehall.records.types import RequestRecord
from servehall.serving.request import RecordEmitter, RequestState


class Bus:
    """The record bus's ``emit``; raises when ``fail``."""

    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.records: list[RequestRecord] = []

    def emit(self, record: RequestRecord) -> None:
        if self.fail:
            raise RuntimeError("bus down")
        self.records.append(record)


class Heard:
    def __init__(self, name: str, log: list[tuple[str, int]]) -> None:
        self.name, self.log = name, log

    def ended(self, state: RequestState, now: float) -> None:
        self.log.append((self.name, state.record.status_code))


def _host(bus: Bus | None) -> Host:
    host = Host(settings=Settings(), plugins=PluginHost([]))
    host.records = bus
    return host


def test_listeners_hear_the_completed_record_once_in_order() -> None:
    heard: list[tuple[str, int]] = []
    bus = Bus()
    state = RequestState(
        _host(bus),
        None,
        "r1",
        "/v1/completions",
        None,
        [Heard("a", heard), RecordEmitter(), Heard("b", heard)],
    )
    state.finish(404, error_code="model_not_found")
    state.finish(200)  # idempotent: nothing more
    assert heard == [("a", 404), ("b", 404)]
    assert [(r.request_id, r.status_code, r.error_code) for r in bus.records] == [
        ("r1", 404, "model_not_found")
    ]
    assert bus.records[0] is not state.record  # the bus gets a copy


def test_no_listener_no_report() -> None:
    bus = Bus()
    RequestState(_host(bus), None, "r1", "/v1/completions", None).finish(200)
    assert bus.records == []


def test_record_emitter_logs_a_rejecting_bus(caplog: pytest.LogCaptureFixture) -> None:
    heard: list[tuple[str, int]] = []
    state = RequestState(
        _host(Bus(fail=True)), None, "r1", "/v1/completions", None, [RecordEmitter()]
    )
    state.listeners.append(Heard("after", heard))
    with caplog.at_level(logging.ERROR, logger="servehall.request"):
        state.finish(200)
    assert "record bus rejected a request record" in caplog.text
    assert heard == [("after", 200)]  # the listeners after it still hear the request


def test_record_emitter_runs_inside_around() -> None:
    events: list[str] = []

    @contextlib.contextmanager
    def around() -> Iterator[Any]:
        events.append("open")
        yield
        events.append("close")

    class Seen(Bus):
        def emit(self, record: RequestRecord) -> None:
            events.append("emit")

    state = RequestState(_host(Seen()), None, "r1", "/v1/completions", None)
    RecordEmitter(around).ended(state, 0.0)
    assert events == ["open", "emit", "close"]
    # without a bus the wrapper still runs (a traced request has its record span)
    events.clear()
    RecordEmitter(around).ended(RequestState(_host(None), None, "r2", "/x", None), 0.0)
    assert events == ["open", "close"]


def test_request_params_are_the_genai_attributes() -> None:
    state = RequestState(_host(None), None, "r1", "/v1/completions", None)
    state.request_params(16, 0.5, None)
    assert state.request_attrs == {
        "gen_ai.request.max_tokens": 16,
        "gen_ai.request.temperature": 0.5,
        "gen_ai.request.top_p": None,
    }
