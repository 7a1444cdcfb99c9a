"""Tests of servehall.testing.vllm_env: where the vLLM environment's interpreter is
looked for, and that a missing one skips a test — or fails it under CI."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from servehall.testing.vllm_env import ENV_VAR, in_ci, vllm_python, vllm_python_path


@pytest.mark.parametrize(
    ("value", "ci"),
    [("true", True), ("1", True), (" YES ", True), ("false", False), ("", False), ("0", False)],
)
def test_in_ci(value: str, ci: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CI", value)
    assert in_ci() is ci


def test_path_from_the_environment_or_beside_this_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_VAR, "/opt/vllm/bin/python")
    assert vllm_python_path() == Path("/opt/vllm/bin/python")
    monkeypatch.delenv(ENV_VAR)
    assert vllm_python_path() == Path(sys.prefix).parent / ".venv-vllm" / "bin" / "python"


def _fake_env(root: Path) -> Path:
    """An interpreter path inside a venv-like tree (``bin/python`` beside ``lib``)."""
    (root / "bin").mkdir(parents=True)
    (root / "lib").mkdir()
    python = root / "bin" / "python"
    python.write_text("#!/bin/sh\n")
    return python


def test_an_existing_environment_is_returned(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    python = _fake_env(tmp_path / "venv")
    monkeypatch.setenv(ENV_VAR, str(python))
    assert vllm_python() == python


def test_a_missing_environment_skips_or_fails_under_ci(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENV_VAR, str(tmp_path / "nowhere" / "python"))
    monkeypatch.setenv("CI", "")
    with pytest.raises(pytest.skip.Exception, match="no vLLM environment at"):
        vllm_python()
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match=r"scripts/install\.sh --dev"):
        vllm_python()
    # an interpreter without the environment's lib/ is not one
    lone = tmp_path / "lone" / "bin" / "python"
    lone.parent.mkdir(parents=True)
    lone.write_text("")
    monkeypatch.setenv(ENV_VAR, str(lone))
    with pytest.raises(pytest.fail.Exception):
        vllm_python()
