"""Where uploaded files' contents are kept: the :class:`FileStore` contract and the
directory store (the default; the database or an S3-compatible store can implement the
same three calls).

Keys are opaque strings of ``[A-Za-z0-9_-]`` chosen by the caller (the file id); the
store never interprets them as paths beyond one name in its directory. The calls are
synchronous (file I/O): the API runs them on a worker thread.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Protocol

CHUNK = 1024 * 1024
"""Bytes copied per read."""

_KEY = re.compile(r"^[A-Za-z0-9_-]{1,200}$")


@dataclass(frozen=True, slots=True)
class StoredBlob:
    """What :meth:`FileStore.put` wrote: ``size`` in bytes, ``sha256`` hex."""

    size: int
    sha256: str


class FileStore(Protocol):
    """Keeps file contents by key."""

    def put(self, key: str, src: BinaryIO) -> StoredBlob:
        """Store everything ``src`` reads (from its current position) under ``key``,
        whole or not at all; replaces an older content of the same key.

        Raises:
            ValueError: ``key`` is not a valid key.
            OSError: the store cannot write (disk full, permissions).
        """
        ...

    def open(self, key: str) -> BinaryIO:
        """The content under ``key``, opened for reading (the caller closes it).

        Raises:
            FileNotFoundError: no content under ``key``.
        """
        ...

    def delete(self, key: str) -> None:
        """Remove the content under ``key``; nothing when there is none."""
        ...


def check_key(key: str) -> str:
    """``key`` when it is a valid store key; ValueError otherwise."""
    if not _KEY.match(key):
        raise ValueError(f"invalid file store key {key[:40]!r}")
    return key


class DirectoryStore:
    """A :class:`FileStore` in one directory (created on first write): each content is
    the file ``<dir>/<key>``, written to a temporary file in the same directory, flushed
    to disk and renamed into place, so a reader never sees a partial file."""

    def __init__(self, root: Path | str) -> None:
        self.root = Path(root).expanduser()

    def _path(self, key: str) -> Path:
        return self.root / check_key(key)

    def put(self, key: str, src: BinaryIO) -> StoredBlob:
        """See :meth:`FileStore.put`."""
        target = self._path(key)
        self.root.mkdir(parents=True, exist_ok=True)
        digest = hashlib.sha256()
        size = 0
        fd, tmp = tempfile.mkstemp(dir=self.root, prefix=".upload-", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as out:
                while chunk := src.read(CHUNK):
                    digest.update(chunk)
                    size += len(chunk)
                    out.write(chunk)
                out.flush()
                os.fsync(out.fileno())
            os.replace(tmp, target)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        return StoredBlob(size=size, sha256=digest.hexdigest())

    def open(self, key: str) -> BinaryIO:
        """See :meth:`FileStore.open`."""
        return self._path(key).open("rb")

    def delete(self, key: str) -> None:
        """See :meth:`FileStore.delete`."""
        with contextlib.suppress(FileNotFoundError):
            self._path(key).unlink()
