"""Model conversions shared by engines that compile a Hugging Face directory once.

The OpenVINO backend (HF → OpenVINO IR) and the ONNX Runtime engine (HF → ONNX GenAI
model) follow one recipe: a cache key over the source files and the converter's
versions, a child process that does the heavy work (so torch and the exporter never load
into the serving process), a progress display while it runs, and
:func:`servehall.build_atomically` around it. This module holds the two shared parts:

* :func:`source_digest` — SHA-256 over every non-hidden file of a directory (relative
  path, size, content) plus a JSON-able ``salt`` (options, versions);
* :func:`run_converter` — run a converter command with a rich spinner on stderr and
  raise :class:`~servehall.EngineError` with the tail of its log when it fails.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from servehall.errors import EngineError

LOG_TAIL_CHARS = 2000
"""How much of a failed converter's output the error message keeps."""


def source_digest(src: Path, salt: object) -> str:
    """SHA-256 hex over ``salt`` (JSON-encoded) and every file below ``src``.

    Hidden files and folders (a leading ``.``) are skipped; each file contributes its
    relative POSIX path, size and content, in sorted order.
    """
    h = hashlib.sha256()
    h.update(json.dumps(salt, sort_keys=True, default=str).encode())
    for f in sorted(p for p in src.rglob("*") if p.is_file()):
        rel = f.relative_to(src)
        if any(part.startswith(".") for part in rel.parts):
            continue
        h.update(f"{rel.as_posix()}\0{f.stat().st_size}\0".encode())
        with open(f, "rb") as fh:
            h.update(hashlib.file_digest(fh, "sha256").digest())
    return h.hexdigest()


def run_converter(
    cmd: Sequence[str], log_path: Path, *, label: str, what: str, quiet: bool = False
) -> None:
    """Run ``cmd`` (offline: ``HF_HUB_OFFLINE=1``), output to ``log_path``, with a spinner.

    Args:
        cmd: the converter command line.
        log_path: file that receives the child's stdout and stderr; removed afterwards.
        label: the spinner's text (rich markup allowed), e.g. ``"converting m to IR"``.
        what: the failure message's start, e.g. ``"converting /m to OpenVINO IR"``.
        quiet: no display.

    Raises:
        EngineError: ``"<what> failed (exit N): <log tail>"`` when the child exits non-zero.
    """
    from rich.console import Console
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    console = Console(stderr=True)
    # the spinner only on a terminal: a log file gets the callers' timestamped log lines
    console.quiet = quiet or not console.is_terminal
    with (
        open(log_path, "wb") as log,
        Progress(
            SpinnerColumn(),
            TextColumn(label),
            TimeElapsedColumn(),
            console=console,
            transient=True,
        ) as progress,
    ):
        task = progress.add_task(label, total=None)
        proc = subprocess.Popen(list(cmd), stdout=log, stderr=subprocess.STDOUT, env=env)
        while proc.poll() is None:
            time.sleep(0.2)
            progress.advance(task)
    tail = log_path.read_text(errors="replace")[-LOG_TAIL_CHARS:]
    log_path.unlink(missing_ok=True)
    if proc.returncode != 0:
        raise EngineError(f"{what} failed (exit {proc.returncode}): {tail}")
