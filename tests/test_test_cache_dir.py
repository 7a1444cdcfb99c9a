"""Issue #13 §3.9: the tests use a temporary cache directory, never ~/.cache/servehall,
and share one demo-model build per session (root ``conftest.py``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from servehall import servehall_cache_dir


def test_cache_dir_is_the_sessions_not_the_users(demo_model_dir: Path) -> None:
    cache = Path(os.environ["SERVEHALL_CACHE_DIR"]).resolve()
    user = (Path.home() / ".cache" / "servehall").resolve()
    assert cache != user and user not in cache.parents
    if not os.environ.get("SERVEHALL_TEST_CACHE_DIR"):
        assert cache.name.startswith("servehall-test-cache-")
    assert servehall_cache_dir("openvino") == cache / "openvino"
    if not os.environ.get("SERVEHALL_TEST_DEMO_DIR"):
        assert demo_model_dir == cache / "demo-model"
    # servers and CLI runs started by the tests inherit it
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "from servehall.demo import DEFAULT_DEMO_DIR; print(DEFAULT_DEMO_DIR)",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert Path(out).resolve() == cache / "demo-model"
