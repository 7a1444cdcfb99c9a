"""Configuration: pydantic-settings models, loading and masking."""

from servehall.config.models import (
    DatabaseSettings,
    ModelConfig,
    PluginsSettings,
    SchedulerSettings,
    ServerSettings,
    SinkConfig,
    TracingSettings,
)
from servehall.config.secrets import Secret, resolve_secret
from servehall.config.settings import (
    Settings,
    load_settings,
    masked_dump,
    read_config_file,
    validate_plugin_sections,
)

__all__ = [
    "DatabaseSettings",
    "ModelConfig",
    "PluginsSettings",
    "SchedulerSettings",
    "Secret",
    "ServerSettings",
    "Settings",
    "SinkConfig",
    "TracingSettings",
    "load_settings",
    "masked_dump",
    "read_config_file",
    "resolve_secret",
    "validate_plugin_sections",
]
