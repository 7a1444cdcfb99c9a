"""The record bus: the request path's only door to the records layer.

Interface used by the request path (kept stable for the records layer to fill in):

* ``await open_record_bus(settings, plugins) -> RecordBus`` at startup;
* ``bus.emit(RequestRecord)`` and ``bus.audit(AuditEvent)``: synchronous, never block,
  never raise;
* ``bus.check_admission()``: raises ``ServiceUnavailableError`` (503) while a
  ``required`` sink cannot write and its buffer is exhausted (fail closed);
* ``await bus.close()``: flush and close at shutdown.

This first version keeps records in a bounded in-memory list (for tests and for hosts
without sinks); the SQL/JSON-lines pipeline replaces it.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

from servehall.records.types import AuditEvent, Record, RequestRecord

if TYPE_CHECKING:
    from servehall.config.settings import Settings
    from servehall.plugins import PluginHost


class RecordBus:
    """Bounded in-memory record bus (placeholder pipeline)."""

    def __init__(self, maxlen: int = 10_000) -> None:
        self.recent: deque[Record] = deque(maxlen=maxlen)

    def emit(self, record: RequestRecord) -> None:
        """Queue a request-log record."""
        self.recent.append(record)

    def audit(self, event: AuditEvent) -> None:
        """Queue an audit event."""
        self.recent.append(event)

    def check_admission(self) -> None:
        """Raise ServiceUnavailableError when records cannot be kept (never, here)."""

    async def close(self) -> None:
        """Flush and close (nothing to do here)."""


async def open_record_bus(settings: Settings, plugins: PluginHost) -> RecordBus:
    """Build and start the bus for this deployment."""
    return RecordBus()
