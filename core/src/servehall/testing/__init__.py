"""Test support shipped with the core: the backend conformance kit (pytest plugin)."""
