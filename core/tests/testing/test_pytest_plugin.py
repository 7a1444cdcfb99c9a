"""Tests of servehall.testing.pytest_plugin: its fixtures, as any test (or a plugin's
conformance suite) gets them by name through the ``pytest11`` entry point."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest


def test_conformance_defaults_are_none(
    conformance_backend_spec: Any, conformance_crash: Any
) -> None:
    assert conformance_backend_spec is None and conformance_crash is None


def test_tiny_llama_is_built_once_per_session(
    servehall_tiny_llama: Path, request: pytest.FixtureRequest
) -> None:
    assert (servehall_tiny_llama / "config.json").is_file()
    assert json.loads((servehall_tiny_llama / "config.json").read_text())["vocab_size"] == 512
    assert request.getfixturevalue("servehall_tiny_llama") == servehall_tiny_llama


def test_the_plugin_is_registered_for_pytest() -> None:
    from importlib.metadata import entry_points

    names = {ep.value for ep in entry_points(group="pytest11")}
    assert "servehall.testing.pytest_plugin" in names
