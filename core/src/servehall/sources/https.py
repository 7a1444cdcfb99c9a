"""A plain HTTP(S) mirror: ``https://host/dir`` serves the model's files as
``https://host/dir/<path>`` (any static file server; read-only)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import httpx

from servehall.config.models import ModelStoreSettings
from servehall.sources.errors import SourceError, StoreUnavailableError
from servehall.sources.store import Progress, write_chunks


class HttpStore:
    """The files under one base URL (see the module docstring)."""

    def __init__(self, url: str, settings: ModelStoreSettings) -> None:
        self.url = url.rstrip("/")
        self._timeout = httpx.Timeout(settings.timeout_s)

    def _get(self, client: httpx.Client, name: str) -> httpx.Response:
        where = f"{self.url}/{name}"
        try:
            resp = client.send(
                client.build_request("GET", f"{self.url}/{quote(name)}"), stream=True
            )
        except httpx.HTTPError as exc:
            raise StoreUnavailableError(f"{where}: the mirror is unreachable ({exc})") from None
        if resp.status_code == 200:
            return resp
        resp.close()
        if resp.status_code >= 500:
            raise StoreUnavailableError(f"{where}: the mirror answered {resp.status_code}")
        if resp.status_code in (401, 403):
            raise SourceError(f"{where}: the mirror refused access ({resp.status_code})")
        if resp.status_code == 404:
            raise SourceError(f"{where}: no such file")
        raise SourceError(f"{where}: the mirror answered {resp.status_code}")

    def read(self, name: str) -> bytes:
        """See :meth:`servehall.sources.store.Store.read`."""
        with httpx.Client(timeout=self._timeout, follow_redirects=True) as client:
            resp = self._get(client, name)
            try:
                return resp.read()
            except httpx.HTTPError as exc:
                raise StoreUnavailableError(f"{self.url}/{name}: read failed ({exc})") from None
            finally:
                resp.close()

    def download(self, name: str, dest: Path, progress: Progress) -> str:
        """See :meth:`servehall.sources.store.Store.download`."""
        with httpx.Client(timeout=self._timeout, follow_redirects=True) as client:
            resp = self._get(client, name)

            def chunks() -> Iterator[bytes]:
                try:
                    yield from resp.iter_bytes(1024 * 1024)
                except httpx.HTTPError as exc:
                    raise StoreUnavailableError(
                        f"{self.url}/{name}: download broke off ({exc})"
                    ) from None

            try:
                return write_chunks(chunks(), dest, progress)
            except OSError as exc:  # the connection, while reading
                raise StoreUnavailableError(
                    f"{self.url}/{name}: download broke off ({exc})"
                ) from None
            finally:
                resp.close()

    def upload(self, src: Path, name: str) -> None:
        """Refused: a mirror is read-only."""
        raise SourceError(f"{self.url}: an http(s) mirror is read-only; push to an s3:// URL")
