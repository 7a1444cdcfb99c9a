"""The node-local model cache every servehall process of a node shares.

Layout under ``[model_store] cache_dir``::

    <key>/               a complete model: every file matched the manifest (a copy of
                         which, servehall-manifest.json, is inside); renamed into place
    <key>.partial/       a pull in progress or interrupted (the next pull resumes it)
    <key>.json           {"source": URL, "bytes": N}: what ``models ls`` shows
    <key>.pull.lock      held (flock, exclusive) while a process pulls <key>
    <key>.use.lock       held (flock, shared) by every process that runs <key>
    by-url/<hash>        the key last pulled from a URL (used when the store is down)

``<key>`` is the SHA-256 of the model's manifest (its first 32 hex digits), so a model
pushed again with other content is a new entry. The locks are ``flock`` locks on files
of the cache directory: they work between the processes of one node (on a local
filesystem) and are released by the kernel when a process dies. Eviction removes the
least recently used complete entries (a directory's modification time, touched at each
pull) whose ``use`` lock it can take, i.e. that no process runs, and never an entry
being pulled.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from servehall.sources.errors import SourceError


@dataclass(frozen=True)
class CacheEntry:
    """One complete model in the cache: ``key``, directory, size, the URL it came from,
    last use (epoch seconds) and whether some process runs it now."""

    key: str
    path: Path
    bytes: int
    source: str
    last_used: float
    in_use: bool


class Lease:
    """A shared hold on one entry (its ``use`` lock): eviction skips it until
    :meth:`release` (or the process ends)."""

    def __init__(self, fd: int, key: str) -> None:
        self._fd: int | None = fd
        self.key = key

    def release(self) -> None:
        """Let the entry go (idempotent)."""
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor drops the flock
            self._fd = None


def url_hash(url: str) -> str:
    """The file name under ``by-url/`` of ``url``."""
    return hashlib.sha256(url.rstrip("/").encode()).hexdigest()[:32]


class ModelCache:
    """The cache directory ``root`` bounded to ``max_bytes`` (0: unbounded)."""

    def __init__(self, root: Path, max_bytes: int = 0) -> None:
        self.root = root
        self.max_bytes = max_bytes

    def ensure(self) -> None:
        """Create the cache directory. Raises SourceError when it cannot be."""
        try:
            (self.root / "by-url").mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise SourceError(
                f"cannot create the model cache {self.root}: {exc.strerror}"
            ) from None

    def entry_dir(self, key: str) -> Path:
        """Where the complete model ``key`` lives."""
        return self.root / key

    def partial_dir(self, key: str) -> Path:
        """Where the model ``key`` is downloaded before it is renamed into place."""
        return self.root / f"{key}.partial"

    def is_complete(self, key: str) -> bool:
        """True when the model ``key`` is in place."""
        return self.entry_dir(key).is_dir()

    def _open_lock(self, key: str, kind: str) -> int:
        return os.open(self.root / f"{key}.{kind}.lock", os.O_RDWR | os.O_CREAT, 0o644)

    @contextlib.contextmanager
    def pulling(self, key: str) -> Iterator[None]:
        """Hold ``key``'s pull lock (exclusive; waits for another process's pull)."""
        fd = self._open_lock(key, "pull")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def lease(self, key: str) -> Lease:
        """A shared hold on ``key`` (see :class:`Lease`)."""
        fd = self._open_lock(key, "use")
        fcntl.flock(fd, fcntl.LOCK_SH)
        return Lease(fd, key)

    def commit(self, key: str, source: str, nbytes: int) -> Path:
        """Rename the finished ``<key>.partial`` into place and record where it came from;
        the entry's directory."""
        dest = self.entry_dir(key)
        (self.root / f"{key}.json").write_text(
            json.dumps({"source": source, "bytes": nbytes}), encoding="utf-8"
        )
        os.replace(self.partial_dir(key), dest)
        self.remember(source, key)
        return dest

    def remember(self, url: str, key: str) -> None:
        """Note ``key`` as the model last pulled from ``url``."""
        tmp = self.root / "by-url" / f".{uuid.uuid4().hex}"
        tmp.write_text(key, encoding="utf-8")
        os.replace(tmp, self.root / "by-url" / url_hash(url))

    def known(self, url: str) -> str | None:
        """The key last pulled from ``url`` when it is still complete, else None."""
        try:
            key = (self.root / "by-url" / url_hash(url)).read_text(encoding="utf-8").strip()
        except OSError:
            return None
        return key if key and self.is_complete(key) else None

    def touch(self, key: str) -> None:
        """Mark ``key`` used now (its least-recently-used position)."""
        with contextlib.suppress(OSError):
            os.utime(self.entry_dir(key))

    def entries(self) -> list[CacheEntry]:
        """Every complete model, least recently used first."""
        out: list[CacheEntry] = []
        if not self.root.is_dir():
            return out
        for d in self.root.iterdir():
            if not d.is_dir() or "." in d.name or d.name == "by-url":
                continue
            try:
                meta = json.loads((self.root / f"{d.name}.json").read_text(encoding="utf-8"))
                used = d.stat().st_mtime
            except (OSError, ValueError):
                meta, used = {}, 0.0
            out.append(
                CacheEntry(
                    key=d.name,
                    path=d,
                    bytes=int(meta.get("bytes", 0)),
                    source=str(meta.get("source", "")),
                    last_used=used,
                    in_use=self._in_use(d.name),
                )
            )
        out.sort(key=lambda e: e.last_used)
        return out

    def _in_use(self, key: str) -> bool:
        fd = self._open_lock(key, "use")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        finally:
            os.close(fd)
        return False

    def evict(self, need_bytes: int, keep: set[str]) -> list[str]:
        """Remove least recently used entries (not in ``keep``, not in use, not being
        pulled) until the cache plus ``need_bytes`` fits ``max_bytes``; the keys
        removed. Nothing when unbounded."""
        if self.max_bytes <= 0:
            return []
        entries = self.entries()
        total = sum(e.bytes for e in entries) + need_bytes
        removed: list[str] = []
        for e in entries:
            if total <= self.max_bytes:
                break
            if e.key in keep or e.in_use:
                continue
            if self._remove_if_idle(e.key):
                total -= e.bytes
                removed.append(e.key)
        return removed

    def _remove_if_idle(self, key: str) -> bool:
        use = self._open_lock(key, "use")
        pull = self._open_lock(key, "pull")
        try:
            try:
                fcntl.flock(use, fcntl.LOCK_EX | fcntl.LOCK_NB)
                fcntl.flock(pull, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return False
            trash = self.root / f"{key}.trash-{uuid.uuid4().hex[:8]}"
            try:
                os.replace(self.entry_dir(key), trash)
            except OSError:
                return False
            with contextlib.suppress(OSError):
                (self.root / f"{key}.json").unlink()
        finally:
            os.close(pull)
            os.close(use)
        shutil.rmtree(trash, ignore_errors=True)
        return True

    def usage_bytes(self) -> int:
        """The size of every complete entry (from their records)."""
        return sum(e.bytes for e in self.entries())
