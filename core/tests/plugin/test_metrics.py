"""servehall.plugin_counter: one counter per name and process, on the served registry."""

from __future__ import annotations

import uuid

import pytest
from prometheus_client import REGISTRY, Gauge, generate_latest

from servehall import plugin_counter


def test_declaring_twice_gives_the_same_counter_on_the_served_registry() -> None:
    name = f"servehall_test_plugin_{uuid.uuid4().hex[:8]}"
    first = plugin_counter(name, "A test counter.", ("rule",))
    again = plugin_counter(name, "A test counter.", ("rule",))
    assert again is first
    first.labels("r1").inc(3)
    assert f'{name}_total{{rule="r1"}} 3.0' in generate_latest(REGISTRY).decode()


def test_a_name_taken_by_another_kind_of_collector_is_refused() -> None:
    name = f"servehall_test_gauge_{uuid.uuid4().hex[:8]}"
    Gauge(name, "A gauge.")
    with pytest.raises(ValueError):
        plugin_counter(name, "Not a gauge.", ())
