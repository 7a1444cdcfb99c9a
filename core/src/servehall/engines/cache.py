"""Cache directories built once, safely, by concurrent processes.

:func:`build_atomically` is the pattern behind the demo model
(:func:`servehall.demo.build_demo_model`) and the ``openvino_cpu`` IR cache: builders of
one target serialise on ``<parent>/.<name>.lock`` (``fcntl.flock``; a no-op where
``fcntl`` is missing); the content is written into a temporary sibling
``<parent>/.<name>.build-XXXX`` and moved into place with ``os.rename``, so a reader never
sees a half-written directory, and a failed build leaves nothing behind (a disk that
fills up during the build is one :class:`DiskFullError`; temporary directories left by
a builder that was killed are removed by the next build of the target).
:func:`servehall_cache_dir` is the default location of such directories, and
:func:`installed_versions` records what a build depended on (for cache keys, manifests).
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from importlib import metadata
from pathlib import Path

from servehall.errors import EngineError


class DiskFullError(EngineError):
    """A build ran out of disk space (ENOSPC); nothing half-written was kept."""


def servehall_cache_dir(name: str) -> Path:
    """``$SERVEHALL_CACHE_DIR/<name>``, else ``~/.cache/servehall/<name>`` (not created)."""
    base = os.environ.get("SERVEHALL_CACHE_DIR") or "~/.cache/servehall"
    return Path(base).expanduser() / name


def installed_versions(dists: Iterable[str]) -> dict[str, str | None]:
    """The installed version of each distribution in ``dists`` (None when not installed),
    in the given order."""
    out: dict[str, str | None] = {}
    for dist in dists:
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = None
    return out


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive advisory lock on ``path`` (created if missing) for the block.

    Blocks until the lock is free. A no-op where ``fcntl`` is missing (non-POSIX).
    """
    try:
        import fcntl
    except ImportError:  # pragma: no cover - non-POSIX
        yield
        return
    with open(path, "a+b") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def build_atomically(
    target: Path,
    build: Callable[[Path], None],
    *,
    is_ready: Callable[[Path], bool],
    force: bool = False,
) -> Path:
    """Return ``target``, building it with ``build(tmp_dir)`` unless it is ready already.

    Args:
        target: the directory to produce (its parent is created).
        build: writes the complete content into the empty temporary directory it gets
            (a sibling of ``target``); it may raise to refuse (nothing is moved then).
            It runs under the lock, so it may also inspect ``target``.
        is_ready: True when a directory is a finished, usable build (checked before
            taking the lock and again under it, so a build another process finished
            while this one waited is reused).
        force: build even when ``target`` is ready.

    Returns ``target`` (as given). An existing ``target`` is replaced: it is renamed aside,
    the new build renamed into place, then the old one removed.

    Raises whatever ``build`` raises (after removing the temporary directory),
    :class:`DiskFullError` when a write ran out of space (ENOSPC, EDQUOT) — one line
    naming the target and the free space left — and OSError when the parent cannot be
    created or the rename fails.
    """
    if not force and is_ready(target):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with file_lock(target.parent / f".{target.name}.lock"):
        if not force and is_ready(target):
            return target  # another process built it while we waited
        # under the lock no other builder of this target runs: these are a killed one's
        for stale in target.parent.glob(f".{target.name}.build-*"):
            shutil.rmtree(stale, ignore_errors=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.build-", dir=target.parent))
        try:
            build(tmp)
            _swap_into_place(tmp, target)
        except OSError as exc:
            if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            shutil.rmtree(tmp, ignore_errors=True)
            raise DiskFullError(
                f"building {target} failed: the disk is full ({exc.strerror}; "
                f"{_free_mib(target.parent)} MiB free on {target.parent}); free space or "
                "point the cache directory elsewhere — nothing half-written was kept"
            ) from None
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def _free_mib(path: Path) -> int:
    """MiB available to this user on ``path``'s file system (-1 when unknown)."""
    try:
        st = os.statvfs(path)
    except OSError:
        return -1
    return st.f_bavail * st.f_frsize // (1 << 20)


def _swap_into_place(tmp: Path, target: Path) -> None:
    """Move ``tmp`` to ``target``; an existing ``target`` is moved aside first."""
    if target.exists():
        old = target.parent / f".{target.name}.old-{os.getpid()}-{time.monotonic_ns()}"
        os.rename(target, old)
        os.rename(tmp, target)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.rename(tmp, target)
