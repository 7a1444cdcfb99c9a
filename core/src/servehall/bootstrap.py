"""Load a deployment: config file + enabled plugins + validated plugin sections."""

from __future__ import annotations

from pathlib import Path

from servehall.config.settings import Settings, load_settings, validate_plugin_sections
from servehall.plugins import PluginHost


def load_deployment(
    config: Path | str | None = None, *, load_all: bool = False
) -> tuple[Settings, PluginHost]:
    """Read config, load the enabled plugins, and validate every plugin section.

    Raises:
        ConfigError: the file or a section is invalid (``errors`` lists every problem).
        PluginError: an enabled plugin is unknown.
    """
    settings = load_settings(config)
    plugins = PluginHost(settings.plugins.enabled, load_all=load_all)
    validate_plugin_sections(settings, plugins.settings_models())
    return settings, plugins
