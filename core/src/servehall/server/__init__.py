"""The server runtime: ``servehall serve``, the deployment bootstrap, listeners, accept
errors, process logging, and ``server/hypercorn/`` for the protocol corrections."""
