"""Default plugin: the built-in scheduling policies."""

from __future__ import annotations

from servehall.admission.scheduler import SchedulerSpec
from servehall.plugin.hookimpl import hookimpl
from servehall.plugin.registries import SchedulerRegistry
from servehall.schedulers.fair import FairScheduler
from servehall.schedulers.fcfs import FcfsScheduler
from servehall.schedulers.priority import PriorityScheduler


@hookimpl
def servehall_register_schedulers(registry: SchedulerRegistry) -> None:
    registry.add(SchedulerSpec("fcfs", FcfsScheduler, "first come, first served; bounded queue"))
    registry.add(
        SchedulerSpec(
            "priority",
            PriorityScheduler,
            "higher priority first, FCFS within a level, aging against starvation",
            tenant_settings=frozenset({"max_queue"}),
            settings=frozenset({"aging_s"}),
        )
    )
    registry.add(
        SchedulerSpec(
            "fair",
            FairScheduler,
            "token-weighted fair queueing across tenants (virtual token counters)",
            tenant_settings=frozenset({"weight", "max_queue"}),
            settings=frozenset({"burst_slots"}),
        )
    )
