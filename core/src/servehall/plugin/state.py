"""Typed per-plugin state on the running host (``host.state``), instead of module globals.

A plugin keeps one object of its own class per host: it stores it at startup and finds
it again, typed, in every hook that receives ``host``::

    @hookimpl
    async def servehall_startup(host):
        host.state.put(MyRuntime(host.settings.section("mine")))

    @hookimpl
    async def servehall_authorize(host, admission):
        rt = host.state.require(MyRuntime)   # MyRuntime, or 503 while it is not started

Keys are classes, so two plugins cannot collide unless they share a class, and a type
checker knows what :meth:`get` returns.
"""

from __future__ import annotations

from typing import Any, TypeVar

from servehall.errors import ServiceUnavailableError

T = TypeVar("T")


class PluginState:
    """Objects keyed by their class; one per class."""

    def __init__(self) -> None:
        self._items: dict[type[Any], Any] = {}

    def put(self, obj: object) -> None:
        """Store ``obj`` under ``type(obj)`` (replacing an earlier one)."""
        self._items[type(obj)] = obj

    def get(self, kind: type[T]) -> T | None:
        """The stored object of class ``kind``, or None."""
        obj = self._items.get(kind)
        return obj if isinstance(obj, kind) else None

    def require(self, kind: type[T]) -> T:
        """The stored object of class ``kind``.

        Raises:
            ServiceUnavailableError: none is stored (the plugin has not started, or has
                stopped): 503, so a request is refused rather than served unchecked.
        """
        obj = self.get(kind)
        if obj is None:
            raise ServiceUnavailableError(f"{kind.__name__} is not ready yet; retry later.")
        return obj

    def pop(self, kind: type[T]) -> T | None:
        """Remove and return the object of class ``kind`` (None when absent)."""
        obj = self._items.pop(kind, None)
        return obj if isinstance(obj, kind) else None

    def __contains__(self, kind: object) -> bool:
        return kind in self._items
