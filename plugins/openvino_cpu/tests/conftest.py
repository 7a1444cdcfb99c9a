"""Fixtures of the openvino_cpu tests: the demo model, built and converted once per session."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from servehall import ModelConfig
from servehall.demo import build_demo_model


@pytest.fixture(scope="session")
def ov_demo_dir() -> Path:
    """The demo model (Hugging Face dir); ``$SERVEHALL_TEST_DEMO_DIR`` reuses a build."""
    reuse = os.environ.get("SERVEHALL_TEST_DEMO_DIR")
    if reuse:
        return build_demo_model(Path(reuse))
    from servehall.demo import default_demo_dir

    return build_demo_model(default_demo_dir())  # the session's cache (root conftest.py)


@pytest.fixture(scope="session")
def ov_cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A conversion cache private to this test session."""
    return tmp_path_factory.mktemp("ov-cache")


@pytest.fixture(scope="session")
def ov_ir_dir(ov_demo_dir: Path, ov_cache_dir: Path) -> Path:
    """The demo model converted to OpenVINO IR (once per session)."""
    from servehall_openvino_cpu.convert import resolve_ir_dir

    return resolve_ir_dir(ov_demo_dir, cache_dir=ov_cache_dir, quiet=True)


@pytest.fixture
def ov_model(ov_demo_dir: Path, ov_cache_dir: Path, ov_ir_dir: Path) -> Callable[..., ModelConfig]:
    """``ov_model(**options)`` → a ModelConfig serving the demo model on openvino_cpu
    (a small KV pool; conversion already cached)."""

    def make(**options: Any) -> ModelConfig:
        opts: dict[str, Any] = {"cache_dir": str(ov_cache_dir), "num_kv_blocks": 256}
        opts.update(options)
        return ModelConfig(name="demo", path=ov_demo_dir, backend="openvino_cpu", options=opts)

    return make
