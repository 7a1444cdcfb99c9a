"""Entry point ``webhook_sink`` of the example plugin (group ``servehall``).

Hooks:

* ``servehall_settings_models`` — the ``[webhook_sink]`` section;
* ``servehall_migrations`` — the ``webhook_delivery`` table, branch ``webhook_sink``;
* ``servehall_register_sinks`` — the ``webhook`` sink, chosen with
  ``[[sinks]] name = "webhook"``.

It imports only the public API (``servehall.__all__``). Enable it with
``[plugins] enabled = ["webhook_sink"]``.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from servehall import (
    ConfigError,
    MigrationBranch,
    Settings,
    Sink,
    SinkRegistry,
    SinkSpec,
    hookimpl,
)
from servehall_webhook_sink.settings import WebhookSettings

SERVEHALL_HOOK_API = "2"
SECTION = "webhook_sink"


@hookimpl
def servehall_settings_models() -> list[tuple[str, type[BaseModel]]]:
    """The ``[webhook_sink]`` section."""
    return [(SECTION, WebhookSettings)]


@hookimpl
def servehall_migrations() -> list[MigrationBranch]:
    """The ``webhook_delivery`` table, shipped in this package."""

    def metadata() -> Any:
        from servehall_webhook_sink.table import webhook_metadata

        return webhook_metadata()

    return [MigrationBranch(SECTION, "servehall_webhook_sink:migrations/versions", metadata)]


def webhook_sink(options: dict[str, Any], settings: Settings) -> Sink:
    """Build the sink from ``[webhook_sink]`` (``[[sinks]] options`` must be empty).

    Raises:
        ConfigError: options were given, or the ``[webhook_sink]`` section is missing.
    """
    from servehall_webhook_sink.sink import WebhookSink

    if options:
        raise ConfigError(f"unknown option(s) {', '.join(sorted(options))}; set [webhook_sink]")
    section = settings.section(SECTION)
    if section is None:
        raise ConfigError("the webhook sink needs a [webhook_sink] section with a url")
    cfg = (
        section if isinstance(section, WebhookSettings) else WebhookSettings.model_validate(section)
    )
    return WebhookSink(cfg, settings.database.url.get_secret_value())


@hookimpl
def servehall_register_sinks(registry: SinkRegistry) -> None:
    """The ``webhook`` sink."""
    registry.add(SinkSpec("webhook", webhook_sink, "POST request records to [webhook_sink] url"))
