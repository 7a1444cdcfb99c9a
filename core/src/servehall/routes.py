"""The route table plugins add to through ``servehall_register_routes``."""

from __future__ import annotations

from starlette.routing import BaseRoute


class RouteRegistry:
    """Collects Starlette routes; the host mounts them all behind authentication."""

    def __init__(self) -> None:
        self.routes: list[BaseRoute] = []

    def add(self, route: BaseRoute) -> None:
        """Add a route (``starlette.routing.Route`` or ``Mount``)."""
        self.routes.append(route)
