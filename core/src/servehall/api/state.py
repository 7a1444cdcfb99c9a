"""What the API routes share: the host, its metrics and readiness (``app.state.api``)."""

from __future__ import annotations

from dataclasses import dataclass

from servehall.api.tracing import Tracing
from servehall.metrics import Metrics
from servehall.plugin.host import Host
from servehall.serving.probe import Readiness


@dataclass
class ApiState:
    """Attached to the Starlette app as ``app.state.api``."""

    host: Host
    metrics: Metrics
    readiness: Readiness
    tracing: Tracing | None = None
