"""Default plugin: the core's record sinks ``sql`` and ``jsonl``.

The sink modules (SQLAlchemy, Alembic) are imported only when a sink is built, so
loading the plugin host stays cheap.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from servehall.plugin.hookimpl import hookimpl
from servehall.plugin.registries import SinkRegistry
from servehall.records.types import Sink, SinkSpec

if TYPE_CHECKING:
    from servehall.config.settings import Settings


def sql_sink(options: dict[str, Any], settings: Settings) -> Sink:
    """Build the ``sql`` sink (options: ``url``, default ``[database] url``)."""
    from servehall.records.sql_sink import sql_sink_factory

    return sql_sink_factory(options, settings)


def jsonl_sink(options: dict[str, Any], settings: Settings) -> Sink:
    """Build the ``jsonl`` sink (options: ``path``, a file or ``-`` for stdout)."""
    from servehall.records.jsonl_sink import jsonl_sink_factory

    return jsonl_sink_factory(options, settings)


@hookimpl
def servehall_register_sinks(registry: SinkRegistry) -> None:
    registry.add(
        SinkSpec(
            "sql",
            sql_sink,
            "request_log and audit_event rows in [database] url (SQLite or PostgreSQL)",
        )
    )
    registry.add(
        SinkSpec("jsonl", jsonl_sink, "one JSON object per record to options.path or stdout")
    )
