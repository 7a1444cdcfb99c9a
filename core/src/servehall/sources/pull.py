"""Pull one model from its source into the node's cache, every file verified.

:func:`pull` fetches the store's manifest, takes the entry's pull lock (a second
process pulling the same model waits, then finds it complete: one download), downloads
into ``<key>.partial`` (files already there that match the manifest are kept: an
interrupted pull resumes), checks each file's size and SHA-256 as it is written (a
mismatch deletes the file and refuses the model, naming it) and renames the directory
into place. When the store is unreachable, the copy last pulled from the same URL is
used if the cache still has it. Progress is logged (``servehall.sources``) about every
``LOG_EVERY_S`` seconds and after the last file.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from servehall.config.models import ModelStoreSettings
from servehall.sources.cache import Lease, ModelCache
from servehall.sources.errors import IntegrityError, SourceError, StoreUnavailableError
from servehall.sources.manifest import MANIFEST_NAME, Manifest
from servehall.sources.store import Store, open_store

log = logging.getLogger("servehall.sources")

LOG_EVERY_S = 5.0
"""Seconds between two progress lines of one pull."""


@dataclass
class PullProgress:
    """Where a pull stands: files and bytes done of the totals."""

    files_done: int = 0
    files_total: int = 0
    bytes_done: int = 0
    bytes_total: int = 0

    def describe(self) -> str:
        """``"pulling 3/7 files, 12.5/40.0 MB"``."""
        return (
            f"pulling {self.files_done}/{self.files_total} files, "
            f"{self.bytes_done / 1e6:.1f}/{self.bytes_total / 1e6:.1f} MB"
        )


@dataclass
class Pulled:
    """A pulled model: its cached directory, cache key, what this pull downloaded
    (0 files when it was complete already) and, when asked for, the lease that keeps
    it from eviction."""

    path: Path
    key: str
    files_downloaded: int
    bytes_downloaded: int
    lease: Lease | None = None
    offline: bool = False


def pull(
    url: str,
    settings: ModelStoreSettings,
    *,
    label: str = "",
    lease: bool = False,
    on_progress: Callable[[PullProgress], None] | None = None,
    store: Store | None = None,
) -> Pulled:
    """Bring the model at ``url`` into the cache (see the module docstring).

    Args:
        url: ``s3://…``, ``https://…`` or ``http://…``.
        settings: ``[model_store]``.
        label: how log lines name the model (default: the URL).
        lease: also take a :class:`~servehall.sources.cache.Lease` (for a version that
            runs the model; the caller releases it).
        on_progress: called with the progress after each chunk written.
        store: the store to use (default :func:`~servehall.sources.store.open_store`).

    Raises:
        IntegrityError: a file does not match the manifest (names it).
        StoreUnavailableError: the store did not answer and no copy is cached.
        SourceError: a malformed manifest, refused credentials, a missing object, a
            cache that cannot be written (a full disk).
    """
    label = label or url
    store = store or open_store(url, settings)
    cache = ModelCache(settings.cache_dir, settings.cache_max_bytes)
    cache.ensure()
    try:
        raw = store.read(MANIFEST_NAME)
    except StoreUnavailableError as exc:
        key = cache.known(url)
        if key is None:
            raise StoreUnavailableError(f"{exc.message}; no copy in the cache") from None
        log.warning("model %s: %s; using the copy cached before (%s)", label, exc.message, key)
        held = cache.lease(key) if lease else None
        if not cache.is_complete(key):  # evicted in between
            if held is not None:
                held.release()
            raise StoreUnavailableError(f"{exc.message}; no copy in the cache") from None
        cache.touch(key)
        return Pulled(cache.entry_dir(key), key, 0, 0, held, offline=True)
    manifest = Manifest.parse(raw, f"{url}/{MANIFEST_NAME}")
    key = manifest.digest[:32]
    with cache.pulling(key):
        files = nbytes = 0
        if not cache.is_complete(key):
            cache.evict(manifest.total_bytes, keep={key})
            files, nbytes = _download(store, manifest, cache, key, label, on_progress)
            cache.commit(key, url, manifest.total_bytes)
        else:
            cache.remember(url, key)
        held = cache.lease(key) if lease else None
        cache.touch(key)
    cache.evict(0, keep={key})
    return Pulled(cache.entry_dir(key), key, files, nbytes, held)


def _download(
    store: Store,
    manifest: Manifest,
    cache: ModelCache,
    key: str,
    label: str,
    on_progress: Callable[[PullProgress], None] | None,
) -> tuple[int, int]:
    part = cache.partial_dir(key)
    try:
        part.mkdir(exist_ok=True)
    except OSError as exc:
        raise SourceError(f"cannot create {part}: {exc.strerror}") from None
    prog = PullProgress(files_total=len(manifest.files), bytes_total=manifest.total_bytes)
    last_log = time.monotonic()
    files = nbytes = 0
    log.info("model %s: pulling %s (%s)", label, store.url, prog.describe().split(", ", 1)[1])

    def step(n: int) -> None:
        nonlocal last_log
        prog.bytes_done += n
        if on_progress is not None:
            on_progress(prog)
        if time.monotonic() - last_log >= LOG_EVERY_S:
            last_log = time.monotonic()
            log.info("model %s: %s", label, prog.describe())

    for f in manifest.files:
        dest = part / f.path
        if _already_there(dest, f.size, f.sha256):  # an interrupted pull resumes
            prog.files_done += 1
            step(f.size)
            continue
        try:
            dest.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise SourceError(f"cannot create {dest.parent}: {exc.strerror}") from None
        tmp = dest.with_name(dest.name + ".download")
        digest = store.download(f.path, tmp, step)
        size = tmp.stat().st_size
        if size != f.size or digest != f.sha256:
            tmp.unlink(missing_ok=True)
            detail = (
                f"{size} bytes, the manifest says {f.size}"
                if size != f.size
                else "its SHA-256 differs"
            )
            raise IntegrityError(
                f"{store.url}: file {f.path} does not match {MANIFEST_NAME} ({detail})", f.path
            )
        os.replace(tmp, dest)
        prog.files_done += 1
        files += 1
        nbytes += size
    try:
        (part / MANIFEST_NAME).write_bytes(manifest.raw)
    except OSError as exc:
        raise SourceError(f"cannot write {part / MANIFEST_NAME}: {exc.strerror}") from None
    log.info("model %s: pulled %d files, %.1f MB", label, files, nbytes / 1e6)
    return files, nbytes


def _already_there(dest: Path, size: int, sha256: str) -> bool:
    from servehall.sources.manifest import sha256_file

    try:
        return dest.is_file() and dest.stat().st_size == size and sha256_file(dest) == sha256
    except OSError:
        return False
