"""Versions of the distribution and of the hook contract."""

__version__ = "0.1.0"

HOOK_API_VERSION = "1.0"
"""The hook contract's version: a plugin states the major versions it supports as
``SERVEHALL_HOOK_API = (1, 2)`` (min inclusive, max exclusive) in its entry module."""
