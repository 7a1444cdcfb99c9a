"""``servehall.plugin.registries``: the typed registries the registration hooks fill."""

from __future__ import annotations

import pytest
from starlette.responses import PlainTextResponse
from starlette.routing import Mount, Route

from servehall.admission.scheduler import SchedulerSpec
from servehall.errors import ConfigError
from servehall.plugin.registries import (
    RouteRegistry,
    SchedulerRegistry,
    SinkRegistry,
    ToolParserRegistry,
)
from servehall.records.jsonl_sink import jsonl_sink_factory
from servehall.records.types import SinkSpec
from servehall.schedulers.fcfs import FcfsScheduler
from servehall.tools.parsers import HERMES, LLAMA3_JSON


def test_specs_are_found_by_name_and_listed_sorted() -> None:
    reg = SchedulerRegistry()
    assert reg.names() == []
    reg.add(SchedulerSpec("zeta", FcfsScheduler))
    reg.add(SchedulerSpec("alpha", FcfsScheduler))
    assert reg.names() == ["alpha", "zeta"]
    assert reg.get("zeta").name == "zeta"


def test_a_name_taken_twice_is_refused_naming_the_kind() -> None:
    reg = SinkRegistry()
    reg.add(SinkSpec("jsonl", jsonl_sink_factory))
    with pytest.raises(ConfigError, match="sink 'jsonl' registered twice"):
        reg.add(SinkSpec("jsonl", jsonl_sink_factory))


def test_an_unknown_name_lists_the_known_ones() -> None:
    reg = ToolParserRegistry()
    with pytest.raises(ConfigError, match="unknown tool parser 'x'; known: none"):
        reg.get("x")
    reg.add(LLAMA3_JSON)
    reg.add(HERMES)
    with pytest.raises(ConfigError, match="unknown tool parser 'x'; known: hermes, llama3_json"):
        reg.get("x")
    with pytest.raises(ConfigError, match="unknown scheduler policy 'x'"):
        SchedulerRegistry().get("x")


def test_routes_are_kept_in_order() -> None:
    reg = RouteRegistry()
    first = Route("/a", PlainTextResponse)
    second = Mount("/b", routes=[])
    reg.add(first)
    reg.add(second)
    assert reg.routes == [first, second]
