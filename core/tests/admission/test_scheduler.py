"""``servehall.admission.scheduler``: the scheduling interface — the built-in policies and
their grants satisfy :class:`Scheduler` and :class:`Slot`, and the policies' specs name
only keys the config has (policy-specific ``[scheduler]`` keys of
:data:`POLICY_SETTINGS`, tenant keys of ``[scheduler.tenants.<name>]``)."""

from __future__ import annotations

import pytest

from servehall.admission.scheduler import (
    DEFAULT_TENANT,
    POLICY_SETTINGS,
    Scheduler,
    SchedulerSpec,
    Slot,
    TenantState,
    Ticket,
)
from servehall.config.models import SchedulerSettings, SchedulerTenantSettings
from servehall.plugin.manager import PluginHost


def test_ticket_and_tenant_state_defaults() -> None:
    t = Ticket(request_id="r", model="m")
    assert (t.tenant, t.principal_id, t.priority, t.cost_tokens, t.prompt_tokens) == (
        None,
        None,
        0,
        0,
        0,
    )
    with pytest.raises(AttributeError):
        t.priority = 5  # type: ignore[misc]
    assert TenantState(1, 2, 3).virtual_tokens is None
    assert DEFAULT_TENANT == "default"


@pytest.mark.parametrize("policy", ["fcfs", "priority", "fair"])
async def test_built_in_policies_satisfy_the_interface(policy: str) -> None:
    spec = PluginHost([]).schedulers().get(policy)
    assert isinstance(spec, SchedulerSpec) and spec.name == policy and spec.description
    scheduler = spec.factory(SchedulerSettings())
    assert isinstance(scheduler, Scheduler) and scheduler.name == policy
    slot = await scheduler.acquire(Ticket(request_id="r", model="m"))
    assert isinstance(slot, Slot) and slot.queue_time_s == 0.0
    assert (scheduler.running, scheduler.waiting) == (1, 0)
    slot.release()
    slot.release()  # idempotent
    assert scheduler.running == 0


def test_specs_name_only_known_keys() -> None:
    tenant_keys = set(SchedulerTenantSettings.model_fields)
    scheduler_keys = set(SchedulerSettings.model_fields)
    assert scheduler_keys >= POLICY_SETTINGS
    specs = PluginHost([]).schedulers()
    for name in ("fcfs", "priority", "fair"):
        spec = specs.get(name)
        assert spec.settings <= POLICY_SETTINGS, name
        assert spec.tenant_settings <= tenant_keys, name
    # every policy-specific key is read by some built-in policy
    assert set().union(*(specs.get(n).settings for n in ("priority", "fair"))) == POLICY_SETTINGS


def test_a_class_without_acquire_is_not_a_scheduler() -> None:
    class Half:
        name = "half"
        waiting = 0
        running = 0

    assert not isinstance(Half(), Scheduler)
