"""What the API routes share: the host, its metrics and readiness (``app.state.api``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from servehall.api.disconnect import StallSweeper
from servehall.api.tracing import Tracing
from servehall.files.service import FileService
from servehall.metrics import Metrics
from servehall.plugin.host import Host
from servehall.responses.store import ResponseStore
from servehall.rollout.router import VersionRouter
from servehall.serving.probe import Readiness


@dataclass
class ApiState:
    """Attached to the Starlette app as ``app.state.api``. ``live`` is the
    :class:`~servehall.rollout.live.LiveConfig` of a served host (None in apps built
    without one); ``router`` picks model versions; ``files`` holds the uploaded files
    (``/v1/files``); ``responses`` the stored responses (``/v1/responses``); ``stalls``
    ends the requests whose client stopped reading (``[server] send_timeout_s``)."""

    host: Host
    metrics: Metrics
    readiness: Readiness
    tracing: Tracing | None = None
    live: Any = None
    router: VersionRouter = field(init=False)
    files: FileService = field(init=False)
    responses: ResponseStore = field(init=False)
    stalls: StallSweeper = field(init=False)

    def __post_init__(self) -> None:
        self.router = VersionRouter(self.host)
        self.files = FileService(self.host.settings, self.host.plugins)
        self.responses = ResponseStore(self.host.settings, self.host.plugins)
        self.stalls = StallSweeper(self.host.settings.server.send_timeout_s)
