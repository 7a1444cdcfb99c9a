"""Typed registries handed to the registration hooks (idea from tox 4's registrar objects),
and the route table plugins add to through ``servehall_register_routes``."""

from __future__ import annotations

from typing import Generic, TypeVar

from starlette.routing import BaseRoute

from servehall.admission.scheduler import SchedulerSpec
from servehall.errors import ConfigError
from servehall.records.types import SinkSpec
from servehall.tools.parsers import ToolParser

T = TypeVar("T", SchedulerSpec, SinkSpec, ToolParser)


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


class RouteRegistry:
    """Collects Starlette routes; the host mounts them all behind authentication."""

    def __init__(self) -> None:
        self.routes: list[BaseRoute] = []

    def add(self, route: BaseRoute) -> None:
        """Add a route (``starlette.routing.Route`` or ``Mount``)."""
        self.routes.append(route)


class ToolParserRegistry(_NamedRegistry[ToolParser]):
    """Tool-call parsers by name (``[[models]] tool_parser``): ``registry.add(ToolParser(...))``."""

    kind = "tool parser"
