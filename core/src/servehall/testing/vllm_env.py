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
from typing import Any

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


def run_in_vllm_env(script: str, *args: str, timeout: float = 300.0) -> Any:
    """Run ``python -c script args…`` under :func:`vllm_python` with this checkout's
    ``servehall`` first on ``PYTHONPATH``, and return the JSON value the script printed
    on its last stdout line (tests of code that imports vLLM, which this environment
    lacks). Skips like :func:`vllm_python` when the environment is missing.

    Raises:
        AssertionError: the script exited non-zero (its stderr's tail is the message).
    """
    import json
    import subprocess

    import servehall

    src = str(Path(servehall.__file__).parent.parent)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run(
        [str(vllm_python()), "-c", script, *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])
