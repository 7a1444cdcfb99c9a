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
