"""``servehall.api.state.ApiState``: the services every route shares are built from the
host's settings (files directory, response retention, send timeout) and attached to the
app as ``app.state.api``."""

from __future__ import annotations

from pathlib import Path

from servehall.api.app import create_app
from servehall.api.state import ApiState
from servehall.config.settings import load_settings
from servehall.metrics import Metrics
from servehall.plugin.host import Host
from servehall.plugin.manager import PluginHost
from servehall.serving.probe import Readiness


def test_services_follow_the_settings(tmp_path: Path) -> None:
    settings = load_settings(
        data={
            "files": {"dir": str(tmp_path / "f"), "max_bytes": 2048},
            "responses": {"retention_days": 2},
            "server": {"send_timeout_s": 12},
        }
    )
    host = Host(settings=settings, plugins=PluginHost([]))
    state = ApiState(host=host, metrics=Metrics(), readiness=Readiness(host))
    assert state.router.host is host
    assert state.files.max_bytes == 2048 and state.files.settings is settings
    assert state.responses.settings.responses.retention_days == 2
    assert state.stalls.timeout_s == 12
    assert state.live is None and state.tracing is None


def test_the_app_carries_it(tmp_path: Path) -> None:
    settings = load_settings(data={"files": {"dir": str(tmp_path / "f")}})
    host = Host(settings=settings, plugins=PluginHost([]))
    app = create_app(host)
    api = app.state.api
    assert isinstance(api, ApiState) and api.host is host
    assert api.readiness.host is host
