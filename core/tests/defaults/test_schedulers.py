"""Tests of servehall.defaults.schedulers: the default plugin registers the built-in
policies with the settings each one reads."""

from __future__ import annotations

import pytest

from servehall.config.models import SchedulerSettings
from servehall.defaults.schedulers import servehall_register_schedulers
from servehall.plugin.registries import SchedulerRegistry
from servehall.schedulers.fair import FairScheduler
from servehall.schedulers.fcfs import FcfsScheduler
from servehall.schedulers.priority import PriorityScheduler


@pytest.fixture
def registry() -> SchedulerRegistry:
    reg = SchedulerRegistry()
    servehall_register_schedulers(reg)
    return reg


def test_the_three_policies_are_registered(registry: SchedulerRegistry) -> None:
    assert registry.names() == ["fair", "fcfs", "priority"]


@pytest.mark.parametrize(
    ("name", "cls", "tenant", "settings"),
    [
        ("fcfs", FcfsScheduler, set(), set()),
        ("priority", PriorityScheduler, {"max_queue"}, {"aging_s"}),
        ("fair", FairScheduler, {"weight", "max_queue"}, {"burst_slots"}),
    ],
)
def test_each_policy_builds_and_declares_its_settings(
    registry: SchedulerRegistry, name: str, cls: type, tenant: set[str], settings: set[str]
) -> None:
    spec = registry.get(name)
    assert spec.tenant_settings == tenant and spec.settings == settings
    assert spec.description
    assert isinstance(spec.factory(SchedulerSettings()), cls)


def test_registering_twice_is_refused(registry: SchedulerRegistry) -> None:
    from servehall import ConfigError

    with pytest.raises(ConfigError):
        servehall_register_schedulers(registry)
