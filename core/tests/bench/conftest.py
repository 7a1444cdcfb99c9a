"""Fixtures of the bench command tests (``test_cli.py`` here and in ``soak/``)."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest


@pytest.fixture
def restore_logging() -> Iterator[None]:
    """The bench commands set the process's logging (``bench_logging``): put the root
    and ``servehall`` levels and warnings capture back after the test."""
    root, own = logging.getLogger(), logging.getLogger("servehall")
    levels = (root.level, own.level)
    yield
    root.setLevel(levels[0])
    own.setLevel(levels[1])
    logging.captureWarnings(False)
