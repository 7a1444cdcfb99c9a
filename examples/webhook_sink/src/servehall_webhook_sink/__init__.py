"""servehall-webhook-sink: an example third-party servehall plugin (see docs/plugins.md)."""
