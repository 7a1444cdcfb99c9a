"""Test support shipped with the core.

* :mod:`servehall.testing.conformance` — the backend conformance suite
  (``BackendConformance``: subclass it and provide ``conformance_engine_factory``);
* :mod:`servehall.testing.pytest_plugin` — its default fixtures (loaded via ``pytest11``);
* :mod:`servehall.testing.models` — tiny local models for engine tests.
"""
