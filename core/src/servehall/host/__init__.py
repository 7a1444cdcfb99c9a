"""The running host's model versions: :mod:`servehall.host.versions` starts and stops
them, below both ``rollout/`` (live config, idle unloading) and ``server/`` (``servehall
serve``)."""
