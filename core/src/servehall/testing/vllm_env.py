"""The vLLM test environment: the interpreter of ``.venv-vllm`` (``scripts/install.sh --dev``).

vLLM's CPU build cannot share an environment with optimum-intel (transformers >= 5.16 vs
< 5.6), so the vLLM tests run their engine workers under another interpreter
(``[[models]] worker.python``). :func:`vllm_python` finds it: ``$SERVEHALL_VLLM_PYTHON``,
else ``.venv-vllm/bin/python`` beside the running environment (``.venv``). When it is
missing the tests skip — except under CI (``CI`` set to a true value), where they fail,
so a CI run that lost the install step shows it.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ENV_VAR = "SERVEHALL_VLLM_PYTHON"


def in_ci() -> bool:
    """``$CI`` is set to a true value (``true``, ``1``, ``yes``), as CI services set it."""
    return os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")


def vllm_python_path() -> Path:
    """Where the vLLM environment's interpreter should be (it may not exist)."""
    env = os.environ.get(ENV_VAR)
    if env:
        return Path(env)
    return Path(sys.prefix).parent / ".venv-vllm" / "bin" / "python"


def vllm_python() -> Path:
    """The vLLM environment's interpreter; skips the test when it is missing (fails under
    CI: ``scripts/install.sh --dev`` builds it)."""
    path = vllm_python_path()
    if path.is_file() and (path.parent.parent / "lib").is_dir():
        return path
    msg = f"no vLLM environment at {path} (scripts/install.sh --dev builds .venv-vllm)"
    if in_ci():
        pytest.fail(msg)
    pytest.skip(msg)
