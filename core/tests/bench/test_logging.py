"""``servehall bench`` logging: xgrammar's import-time ``basicConfig`` must not turn the
load generator's per-request httpx lines on (they filled compare reports)."""

from __future__ import annotations

import subprocess
import sys

SCRIPT = """
import logging
from servehall.bench.cli import bench_logging
{setup}
import xgrammar  # what an in-process engine imports: basicConfig(level=INFO)
logging.getLogger("httpx").info('HTTP Request: POST http://x/v1/chat/completions "200"')
logging.getLogger("servehall.engines.conversion").info("converting the model")
logging.getLogger("other").warning("a warning")
"""


def _stderr(setup: str) -> str:
    r = subprocess.run(
        [sys.executable, "-c", SCRIPT.format(setup=setup)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    return r.stderr


def test_bench_logging_keeps_warnings_and_servehall_info_only() -> None:
    err = _stderr("bench_logging()")
    assert "HTTP Request" not in err
    assert "INFO servehall.engines.conversion: converting the model" in err
    assert "WARNING other: a warning" in err


def test_without_it_xgrammar_turns_info_on() -> None:
    """The control: the same import without :func:`bench_logging` logs httpx's line."""
    assert "HTTP Request" in _stderr("")
