"""The plugin contract and its host: hook specifications, the pluggy manager, the
registries handed to registration hooks, per-plugin state, metrics and migrations."""
