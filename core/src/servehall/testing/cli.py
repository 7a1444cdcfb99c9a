"""The real ``servehall`` command line as a subprocess, for tests and benchmarks.

* :func:`servehall_cmd` — the argv prefix that runs ``servehall`` under this interpreter
  (``python -c "from servehall.cli import main; main()"``: no console script needed);
* :func:`run_cli` — run ``servehall ARGS --config CONFIG`` and return the finished process.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path


def servehall_cmd() -> list[str]:
    """The argv prefix that runs the ``servehall`` CLI with this interpreter."""
    return [sys.executable, "-c", "from servehall.cli import main; main()"]


def run_cli(
    config: Path,
    *args: str,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    unset: Sequence[str] = (),
    timeout_s: float = 120.0,
) -> subprocess.CompletedProcess[str]:
    """Run the real ``servehall`` CLI as ``servehall ARGS --config CONFIG`` (a subprocess).

    ``env`` adds variables to this process's environment; ``unset`` names prefixes of
    variables to leave out (e.g. ``"SERVEHALL_DATABASE"``); when either is given,
    ``SERVEHALL_CONFIG`` is dropped too, so that only ``config`` applies. ``cwd`` is the
    working directory (default: this one). Returns the finished process with text
    stdout/stderr; never raises on a non-zero exit (callers assert what they expect).
    Raises ``subprocess.TimeoutExpired`` after ``timeout_s`` seconds.
    """
    full_env: dict[str, str] | None = None
    if env is not None or unset:
        full_env = {
            k: v
            for k, v in os.environ.items()
            if k != "SERVEHALL_CONFIG" and not any(k.startswith(p) for p in unset)
        }
        full_env.update(env or {})
    return subprocess.run(
        [*servehall_cmd(), *args, "--config", str(config)],
        capture_output=True,
        text=True,
        env=full_env,
        cwd=cwd,
        timeout=timeout_s,
    )


def stop_process(
    process: subprocess.Popen[bytes], timeout: float, kill_wait: float = 10.0
) -> int | None:
    """Stop a started ``servehall`` process as an operator would: SIGTERM (a clean
    drain), wait up to ``timeout`` s, then SIGKILL and wait up to ``kill_wait`` s.

    Returns:
        its exit code (negative: the signal that ended it).
    """
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(kill_wait)
    return process.returncode
