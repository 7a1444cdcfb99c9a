"""Test support shipped with the core.

* :mod:`servehall.testing.conformance` — the backend conformance suite
  (``BackendConformance``: subclass it and provide ``conformance_engine_factory``);
* :mod:`servehall.testing.pytest_plugin` — its default fixtures (loaded via ``pytest11``);
* :mod:`servehall.testing.models` — tiny local models for engine tests;
* :mod:`servehall.testing.embeddings` — reference embeddings (transformers, no engine);
* :mod:`servehall.testing.rawhttp` — HTTP/1.1 and HTTP/2 over raw sockets;
* :mod:`servehall.testing.sockets` — a server's TCP socket states and descriptor count.
* :mod:`servehall.testing.embeddings` — reference embeddings (transformers) for engine tests.
"""
