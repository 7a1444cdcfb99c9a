"""The core's default plugins: registered on every host through the same hooks as
third-party plugins (listed in :data:`servehall.plugin.manager.DEFAULT_PLUGINS`)."""
