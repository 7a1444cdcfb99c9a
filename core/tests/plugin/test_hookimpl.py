"""``servehall.plugin.hookimpl``: the marker is the ``servehall`` project's, so a method
marked with it is called by the plugin host (and one without it is not)."""

from __future__ import annotations

from typing import Any

from servehall import hookimpl as public_hookimpl
from servehall.plugin.hookimpl import hookimpl
from servehall.plugin.manager import PluginHost


def test_marker_project_and_re_export() -> None:
    assert hookimpl.project_name == "servehall"
    assert public_hookimpl is hookimpl


def test_marked_methods_are_called() -> None:
    class Routes:
        def __init__(self) -> None:
            self.calls: list[str] = []

        @hookimpl
        def servehall_register_routes(self, router: Any) -> None:
            self.calls.append("marked")

    class Unmarked:
        called = False

        def servehall_register_routes(self, router: Any) -> None:
            Unmarked.called = True

    marked = Routes()
    host = PluginHost([], extra=[("marked", marked), ("unmarked", Unmarked())])
    host.pm.hook.servehall_register_routes(host=None, router=None)
    assert marked.calls == ["marked"]
    assert not Unmarked.called
