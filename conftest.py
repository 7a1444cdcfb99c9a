"""Session-wide test setup for every test directory (core, plugins, end-to-end).

Tests never write into the user's ``~/.cache/servehall``: before any test module is
imported, ``SERVEHALL_CACHE_DIR`` points at a directory of this session (inherited by
the ``servehall serve`` and CLI subprocesses the tests start), so the demo model and the
OpenVINO conversions built during the run land there and are removed at the end. The
demo model is built once per session in ``$SERVEHALL_CACHE_DIR/demo-model`` and shared
by every fixture that needs it (see ``tests/conftest.py``).

``SERVEHALL_TEST_CACHE_DIR=DIR`` uses (and keeps) ``DIR`` instead, to reuse the builds
between runs.

Under pytest-xdist (``make test`` runs the suite with ``-n``) the controller makes the
directory and its workers, started after it with its environment, share it
(``_SESSION_CACHE``): the demo model is built once for the whole run (the build takes a
file lock) and the controller removes the directory at the end.
"""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest

_MADE: list[str] = []
# set by the process that made this run's cache directory; inherited by xdist workers
_SESSION_CACHE = "SERVEHALL_TEST_SESSION_CACHE"


def pytest_configure(config: pytest.Config) -> None:
    keep = os.environ.get("SERVEHALL_TEST_CACHE_DIR")
    if keep:
        os.makedirs(keep, exist_ok=True)
        os.environ["SERVEHALL_CACHE_DIR"] = keep
        return
    shared = os.environ.get(_SESSION_CACHE)
    if os.environ.get("PYTEST_XDIST_WORKER") and shared and os.path.isdir(shared):
        os.environ["SERVEHALL_CACHE_DIR"] = shared  # the controller's, removed by it
        return
    path = tempfile.mkdtemp(prefix="servehall-test-cache-")
    _MADE.append(path)
    os.environ["SERVEHALL_CACHE_DIR"] = path
    os.environ[_SESSION_CACHE] = path


def pytest_unconfigure(config: pytest.Config) -> None:
    while _MADE:
        shutil.rmtree(_MADE.pop(), ignore_errors=True)
