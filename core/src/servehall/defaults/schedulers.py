"""Default plugin: the built-in scheduling policies."""

from __future__ import annotations

from servehall.hookimpl import hookimpl
from servehall.registries import SchedulerRegistry
from servehall.schedulers.fcfs import FcfsScheduler
from servehall.scheduling import SchedulerSpec


@hookimpl
def servehall_register_schedulers(registry: SchedulerRegistry) -> None:
    registry.add(SchedulerSpec("fcfs", FcfsScheduler, "first come, first served; bounded queue"))
