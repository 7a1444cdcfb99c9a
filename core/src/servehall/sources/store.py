"""The ``Store`` contract (where a model's files live) and :func:`open_store`."""

from __future__ import annotations

import errno
import hashlib
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Protocol

from servehall.config.models import ModelStoreSettings
from servehall.sources.errors import SourceError, StoreUnavailableError

Progress = Callable[[int], None]
"""Called with the byte count of each chunk written."""


class Store(Protocol):
    """One model's directory in a store: objects named by their relative path."""

    url: str

    def read(self, name: str) -> bytes:
        """The whole object ``name`` (small ones: the manifest).

        Raises:
            SourceError: no such object, credentials refused.
            StoreUnavailableError: the store did not answer.
        """
        ...

    def download(self, name: str, dest: Path, progress: Progress) -> str:
        """Write object ``name`` to the file ``dest`` (created or truncated) and return
        the SHA-256 (hex) of what was written. Raises like :meth:`read`, and OSError
        from writing ``dest`` (a full disk)."""
        ...

    def upload(self, src: Path, name: str) -> None:
        """Store the file ``src`` as object ``name``. Raises like :meth:`read`;
        SourceError for a read-only store."""
        ...


def write_chunks(chunks: Iterable[bytes], dest: Path, progress: Progress) -> str:
    """Write ``chunks`` to ``dest``, calling ``progress`` per chunk; their SHA-256 (hex).

    Raises:
        SourceError: ``dest`` cannot be written (a full disk: the message says so).
        What iterating ``chunks`` raises.
    """
    h = hashlib.sha256()
    try:
        fh = dest.open("wb")
    except OSError as exc:
        raise _write_error(dest, exc) from None
    with fh:
        for chunk in chunks:
            try:
                fh.write(chunk)
            except OSError as exc:
                raise _write_error(dest, exc) from None
            h.update(chunk)
            progress(len(chunk))
    return h.hexdigest()


def _write_error(dest: Path, exc: OSError) -> SourceError:
    if exc.errno == errno.ENOSPC:
        return SourceError(
            f"disk full writing {dest} (free space, or lower [model_store] cache_max_bytes "
            "so older models are evicted first)"
        )
    return SourceError(f"cannot write {dest}: {exc.strerror or exc}")


def open_store(url: str, settings: ModelStoreSettings) -> Store:
    """The store of ``url`` (``s3://`` through :class:`~servehall.sources.s3.S3Store`,
    ``https://``/``http://`` through :class:`~servehall.sources.https.HttpStore`).

    Raises:
        SourceError: an unknown scheme, or boto3 missing for ``s3://``.
    """
    scheme = url.partition("://")[0].lower()
    if scheme == "s3":
        from servehall.sources.s3 import S3Store

        return S3Store(url, settings)
    if scheme in ("https", "http"):
        from servehall.sources.https import HttpStore

        return HttpStore(url, settings)
    raise SourceError(f"{url}: unknown scheme (s3://, https:// or http://)")


__all__ = ["Progress", "SourceError", "Store", "StoreUnavailableError", "open_store"]
