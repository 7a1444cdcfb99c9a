"""Model conversions shared by engines that compile a Hugging Face directory once.

The OpenVINO backend (HF → OpenVINO IR) and the ONNX Runtime engine (HF → ONNX GenAI
model) follow one recipe: a cache key over the source files and the converter's
versions, a child process that does the heavy work (so torch and the exporter never load
into the serving process), a progress display while it runs, and
:func:`servehall.build_atomically` around it. This module holds the two shared parts:

* :func:`source_digest` — the cache key: SHA-256 over a JSON-able ``salt`` (options,
  versions) and the content digest of every non-hidden file of a directory. Hashing a
  16 GB model takes minutes, so the content digest is stored in a small index keyed on
  the directory's path and each file's (relative path, size, mtime): a start whose files
  kept their size and mtime reads the stored digest (no file content is read); a changed
  size or mtime, a new or removed file makes it hash the content again and store the new
  digest (verified lazily, when the stat says it may have changed — the same trust
  ``make`` and rsync's quick check place in size + mtime);
* :func:`run_converter` — run a converter command that dies with this process
  (``PR_SET_PDEATHSIG``, :mod:`servehall.engines.child`), with a rich spinner on a
  terminal and a progress log line every ``PROGRESS_EVERY_S`` seconds, and raise
  :class:`~servehall.EngineError` with the tail of its log when it fails
  (:class:`~servehall.engines.cache.DiskFullError` when the disk filled up).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import logging
import os
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from servehall.engines.cache import DiskFullError, servehall_cache_dir
from servehall.engines.child import die_with_parent
from servehall.errors import EngineError

log = logging.getLogger("servehall.engines.conversion")

LOG_TAIL_CHARS = 2000
"""How much of a failed converter's output the error message keeps."""

PROGRESS_EVERY_S = 10.0
"""Seconds between the "still converting" log lines of :func:`run_converter`."""

DISK_FULL_MARKS: tuple[str, ...] = ("No space left on device", "ENOSPC", "[Errno 28]")
"""Text in a converter's log that means the disk filled up."""


def _source_files(src: Path) -> list[tuple[str, Path]]:
    """(relative POSIX path, path) of every non-hidden file below ``src``, sorted."""
    out = []
    for f in src.rglob("*"):
        rel = f.relative_to(src)
        if any(part.startswith(".") for part in rel.parts) or not f.is_file():
            continue
        out.append((rel.as_posix(), f))
    return sorted(out)


def stat_fingerprint(src: Path) -> str:
    """SHA-256 hex over ``src``'s absolute path and each file's (relative path, size,
    mtime in ns): what :func:`source_digest` keys its stored content digests on. Reads
    no file content."""
    h = hashlib.sha256(str(Path(src).resolve()).encode())
    for rel, f in _source_files(src):
        st = f.stat()
        h.update(f"\0{rel}\0{st.st_size}\0{st.st_mtime_ns}".encode())
    return h.hexdigest()


def content_digest(src: Path) -> str:
    """SHA-256 hex over every non-hidden file below ``src`` (relative path, size and
    content, in sorted order). Reads every byte: minutes for a 16 GB model."""
    h = hashlib.sha256()
    for rel, f in _source_files(src):
        h.update(f"{rel}\0{f.stat().st_size}\0".encode())
        with open(f, "rb") as fh:
            h.update(hashlib.file_digest(fh, "sha256").digest())
    return h.hexdigest()


def default_digest_index() -> Path:
    """``$SERVEHALL_CACHE_DIR/source-digests`` (else ``~/.cache/servehall/...``)."""
    return servehall_cache_dir("source-digests")


def stored_content_digest(src: Path, index_dir: Path | None = None) -> tuple[str, bool]:
    """``src``'s content digest, read from the index when its stat fingerprint matches.

    Returns (digest, hashed): ``hashed`` is True when the content was read this time
    (no entry, or the path, a size or an mtime changed). The entry is written atomically
    (temporary file + rename); an index that cannot be written only costs a rehash next
    time.
    """
    index = Path(index_dir or default_digest_index())
    fingerprint = stat_fingerprint(src)
    entry = index / f"{hashlib.sha256(str(Path(src).resolve()).encode()).hexdigest()[:32]}.json"
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        stored = json.loads(entry.read_text())
        if stored["fingerprint"] == fingerprint:
            return str(stored["digest"]), False
    started = time.monotonic()
    digest = content_digest(src)
    log.info("hashed %s in %.1f s (stored; next start reads it)", src, time.monotonic() - started)
    try:
        index.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=index, prefix=".entry-")
        with os.fdopen(fd, "w") as fh:
            json.dump({"source": str(src), "fingerprint": fingerprint, "digest": digest}, fh)
        os.replace(tmp, entry)
    except OSError as exc:
        log.warning("source digest of %s not stored in %s: %s", src, index, exc)
    return digest, True


def source_digest(src: Path, salt: object, *, index_dir: Path | None = None) -> str:
    """The conversion cache key: SHA-256 hex over ``salt`` (JSON-encoded) and
    :func:`stored_content_digest` of ``src`` (see the module docstring)."""
    digest, _ = stored_content_digest(src, index_dir)
    h = hashlib.sha256(json.dumps(salt, sort_keys=True, default=str).encode())
    h.update(digest.encode())
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

    The child gets ``PR_SET_PDEATHSIG`` (it is SIGKILLed when this process dies, even by
    SIGKILL) and is waited for on this thread (the signal follows the spawning thread).
    Every ``PROGRESS_EVERY_S`` seconds a log line says how long it has run and its last
    output line.

    Raises:
        DiskFullError: the child failed and its log says the disk is full (ENOSPC).
        EngineError: ``"<what> failed (exit N): <log tail>"`` when the child exits non-zero.
    """
    from rich.console import Console
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    console = Console(stderr=True)
    # the spinner only on a terminal: a log file gets the callers' timestamped log lines
    console.quiet = quiet or not console.is_terminal
    with (
        open(log_path, "wb") as out,
        Progress(
            SpinnerColumn(),
            TextColumn(label),
            TimeElapsedColumn(),
            console=console,
            transient=True,
        ) as progress,
    ):
        task = progress.add_task(label, total=None)
        proc = subprocess.Popen(
            list(cmd),
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            preexec_fn=functools.partial(die_with_parent, os.getpid()),
        )
        started = next_note = time.monotonic()
        next_note += PROGRESS_EVERY_S
        while proc.poll() is None:
            time.sleep(0.2)
            progress.advance(task)
            if not quiet and time.monotonic() >= next_note:
                next_note += PROGRESS_EVERY_S
                last = _last_line(log_path)
                log.info(
                    "%s: running for %.0f s (pid %d)%s",
                    what,
                    time.monotonic() - started,
                    proc.pid,
                    f"; last output: {last}" if last else "",
                )
    tail = log_path.read_text(errors="replace")[-LOG_TAIL_CHARS:]
    log_path.unlink(missing_ok=True)
    if proc.returncode != 0:
        if any(mark in tail for mark in DISK_FULL_MARKS):
            raise DiskFullError(
                f"{what} failed: the disk is full (no space left on device under "
                f"{log_path.parent.parent}); free space or point the cache_dir option "
                "elsewhere — nothing half-written was kept"
            )
        raise EngineError(f"{what} failed (exit {proc.returncode}): {tail}")


def _last_line(path: Path) -> str:
    """The last non-empty line of the file (its last 4 KiB), cut to 200 characters."""
    try:
        with open(path, "rb") as fh:
            fh.seek(max(0, fh.seek(0, os.SEEK_END) - 4096))
            lines = fh.read().decode(errors="replace").replace("\r", "\n").splitlines()
    except OSError:
        return ""
    return next((ln.strip()[:200] for ln in reversed(lines) if ln.strip()), "")
