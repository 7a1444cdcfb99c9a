"""Typed registries handed to the registration hooks (idea from tox 4's registrar objects)."""

from __future__ import annotations

from typing import Generic, TypeVar

from servehall.errors import ConfigError
from servehall.records.types import SinkSpec
from servehall.scheduling import SchedulerSpec

T = TypeVar("T", SchedulerSpec, SinkSpec)


class _NamedRegistry(Generic[T]):
    kind = "item"

    def __init__(self) -> None:
        self._items: dict[str, T] = {}

    def add(self, spec: T) -> None:
        """Register ``spec``; ConfigError when its name is taken."""
        if spec.name in self._items:
            raise ConfigError(f"{self.kind} {spec.name!r} registered twice")
        self._items[spec.name] = spec

    def get(self, name: str) -> T:
        """The spec called ``name``; ConfigError listing the known names otherwise."""
        try:
            return self._items[name]
        except KeyError:
            known = ", ".join(sorted(self._items)) or "none"
            raise ConfigError(f"unknown {self.kind} {name!r}; known: {known}") from None

    def names(self) -> list[str]:
        return sorted(self._items)


class SchedulerRegistry(_NamedRegistry[SchedulerSpec]):
    """Scheduling policies by name (``[scheduler] policy``)."""

    kind = "scheduler policy"


class SinkRegistry(_NamedRegistry[SinkSpec]):
    """Record sinks by name (``[[sinks]] name``)."""

    kind = "sink"
