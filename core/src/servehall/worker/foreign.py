"""A model's worker under another interpreter (``[[models]] worker = { python = ... }``).

Triton's per-model Python execution environments are the idea: one model's engine may need
libraries the API process's environment cannot hold (vLLM's CPU build needs a transformers
that optimum-intel forbids), so its worker runs under that environment's interpreter while
the API process stays as it is. Such a worker is started with :mod:`subprocess`
(``python -m servehall.worker.foreign SPEC.json``), not :mod:`multiprocessing`: a
``spawn``-ed child would inherit the API process's ``sys.path`` and import the wrong
libraries. Everything else — the transport (:mod:`servehall.worker.wire`: it connects to the same
Unix socket path), messages, supervision — is the same.

* :func:`check_interpreter` — run at :meth:`ProcessEngine.start`: the interpreter exists,
  has servehall, and its servehall version and wire protocol
  (:data:`~servehall.worker.messages.WIRE_VERSION`) are this process's; otherwise one
  ``ConfigError`` line naming ``models.<name>.worker.python``.
* :class:`ForeignProcess` — the subprocess, with the part of ``multiprocessing.Process``'s
  interface the supervisor uses (``pid``, ``sentinel``, ``exitcode``, ``kill``, ``join``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from servehall.errors import ConfigError

VERSION_TIMEOUT_S = 120.0
"""Longest wait for the interpreter to report its versions (a cold import on a busy machine)."""


def _versions() -> dict[str, Any]:
    from servehall.version import __version__
    from servehall.worker.messages import WIRE_VERSION

    return {
        "servehall": __version__,
        "wire": WIRE_VERSION,
        "python": sys.version.split()[0],
        "executable": sys.executable,
    }


async def check_interpreter(python: Path, model: str) -> dict[str, Any]:
    """Check that ``python`` can run this servehall's worker (see the module docstring).

    Returns:
        what the interpreter reported: ``servehall`` (version), ``wire`` (protocol
        version), ``python`` (its Python version), ``executable``.

    Raises:
        ConfigError: one line, keyed ``models.<model>.worker.python``: not an executable
            file, servehall not importable there, or another servehall version or wire
            protocol than this process's.
    """
    key = f"models.{model}.worker.python"

    def fail(msg: str) -> ConfigError:
        return ConfigError(f"{key}: {msg}", [(key, msg)])

    if not python.is_file() or not os.access(python, os.X_OK):
        raise fail(f"{python} is not an executable file")
    try:
        proc = await asyncio.create_subprocess_exec(
            str(python),
            "-m",
            "servehall.worker.foreign",
            "--version",
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(proc.communicate(), VERSION_TIMEOUT_S)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        msg = f"{python} did not report its servehall version within {VERSION_TIMEOUT_S:g} s"
        raise fail(msg) from None
    except OSError as exc:
        raise fail(f"{python} cannot be run: {exc.strerror or exc}") from None
    if proc.returncode != 0:
        lines = [ln for ln in err.decode(errors="replace").splitlines() if ln.strip()]
        last = lines[-1].strip() if lines else f"exit status {proc.returncode}"
        raise fail(f"{python} cannot run the servehall worker ({last})")
    try:
        theirs: dict[str, Any] = json.loads(out.decode().strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise fail(f"{python} answered the version check with {out[:200]!r}") from None
    ours = _versions()
    if (theirs.get("servehall"), theirs.get("wire")) != (ours["servehall"], ours["wire"]):
        raise fail(
            f"{python} has servehall {theirs.get('servehall')} (wire protocol "
            f"{theirs.get('wire')}), this API process servehall {ours['servehall']} (wire "
            f"protocol {ours['wire']}): install the same servehall in both environments"
        )
    return theirs


def spec_to_json(spec: Any) -> str:
    """A :class:`~servehall.worker.bootstrap.WorkerSpec` as JSON (plain data, so two
    environments with different pydantic builds read it alike)."""
    from dataclasses import fields

    data = {f.name: getattr(spec, f.name) for f in fields(spec)}
    data["model"] = spec.model.model_dump(mode="json")
    data["plugins"] = list(spec.plugins)
    return json.dumps(data)


def spec_from_json(text: str) -> Any:
    """The :class:`~servehall.worker.bootstrap.WorkerSpec` that :func:`spec_to_json` wrote."""
    from servehall.config.models import ModelConfig
    from servehall.worker.bootstrap import WorkerSpec

    data = json.loads(text)
    data["model"] = ModelConfig.model_validate(data["model"])
    data["plugins"] = tuple(data["plugins"])
    return WorkerSpec(**data)


class ForeignProcess:
    """A worker process under another interpreter.

    Args:
        python: the interpreter.
        spec: the worker's ``WorkerSpec``.
        spec_path: where to write the spec (a private temp directory of the supervisor).

    ``output_fd`` is the read end of the pipe that holds the worker's stdout and stderr
    (the caller owns it). ``sentinel`` is a pidfd: readable once the process has exited.
    """

    def __init__(self, python: Path, spec: Any, spec_path: Path) -> None:
        spec_path.write_text(spec_to_json(spec))
        read_fd, write_fd = os.pipe()
        try:
            self._popen = subprocess.Popen(
                [str(python), "-m", "servehall.worker.foreign", str(spec_path)],
                stdin=subprocess.DEVNULL,
                stdout=write_fd,
                stderr=write_fd,
                close_fds=True,
            )
        except BaseException:
            os.close(read_fd)
            raise
        finally:
            os.close(write_fd)
        self.output_fd = read_fd
        self.pid = self._popen.pid
        self.sentinel = os.pidfd_open(self.pid)

    @property
    def exitcode(self) -> int | None:
        """None while running; else the exit status, or ``-N`` for signal N (as
        ``multiprocessing.Process.exitcode``)."""
        return self._popen.poll()

    def kill(self) -> None:
        """SIGKILL the worker (no-op once it has exited)."""
        with contextlib.suppress(ProcessLookupError):
            self._popen.kill()

    def join(self, timeout: float | None = None) -> None:
        """Wait up to ``timeout`` s for the worker to exit (and reap it)."""
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._popen.wait(timeout)

    def close(self) -> None:
        """Release the pidfd (after the process was reaped)."""
        if self.sentinel >= 0:
            with contextlib.suppress(OSError):
                os.close(self.sentinel)
            self.sentinel = -1


def main(argv: list[str]) -> int:
    """``python -m servehall.worker.foreign --version | SPEC.json`` (see module doc)."""
    if argv[:1] == ["--version"]:
        print(json.dumps(_versions()), flush=True)
        return 0
    from servehall.worker.bootstrap import worker_main

    spec = spec_from_json(Path(argv[0]).read_text())
    worker_main(spec, None)  # exits the process
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
