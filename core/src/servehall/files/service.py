"""The files of one deployment: the :class:`~servehall.files.store.FileStore` that keeps
their contents and the :class:`~servehall.files.catalog.FileCatalog` of their metadata,
opened on first use.

The catalog's database is ``[database] url``; on first use its schema is checked (and
migrated with ``[database] auto_migrate``), as ``[server] config_revisions`` does. A
database that cannot be reached or is not migrated makes each call a 503
``files_unavailable`` (the message names the cause; never a 500), and the next call
tries again.
"""

from __future__ import annotations

import asyncio
import io
import logging
import uuid
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from servehall.errors import ServehallError, ServiceUnavailableError
from servehall.files.catalog import FileCatalog, FileRow
from servehall.files.store import DirectoryStore, FileStore

if TYPE_CHECKING:
    from servehall.config.settings import Settings

log = logging.getLogger("servehall.files")

UNAVAILABLE = "files_unavailable"


def unavailable(why: str) -> ServiceUnavailableError:
    """The 503 of a files call the store or the database cannot serve now."""
    return ServiceUnavailableError(
        f"File storage is unavailable: {why}", code=UNAVAILABLE, headers={"Retry-After": "5"}
    )


class FileService:
    """See the module docstring. ``plugins`` (a
    :class:`~servehall.plugin.manager.PluginHost`, or None) names the migration branches
    the schema check includes."""

    def __init__(self, settings: Settings, plugins: Any = None) -> None:
        self.settings = settings
        self.plugins = plugins
        self.store: FileStore = DirectoryStore(settings.files.dir)
        self._catalog: FileCatalog | None = None
        self._lock = asyncio.Lock()

    @property
    def max_bytes(self) -> int:
        """The largest file one upload may carry (``[files] max_bytes``)."""
        return self.settings.files.max_bytes

    async def catalog(self) -> FileCatalog:
        """The catalog, its database engine made and schema checked on first use.

        Raises:
            ServiceUnavailableError: 503 ``files_unavailable`` when the database cannot
                be reached or is not migrated.
        """
        if self._catalog is not None:
            return self._catalog
        async with self._lock:
            if self._catalog is None:
                self._catalog = await self._open()
        return self._catalog

    async def _open(self) -> FileCatalog:
        from servehall.db.migrate import open_checked

        try:
            engine = await open_checked(self.settings, self.plugins)
        except ServehallError as exc:  # ConfigError, PluginError
            log.warning("files: %s", exc.message)
            raise unavailable(exc.message) from None
        return FileCatalog(engine)

    async def add_bytes(self, owner: str, filename: str, purpose: str, data: bytes) -> FileRow:
        """Store ``data`` as a new file of ``owner`` (the server's own files, e.g. a
        batch's output: purpose ``batch_output``); its row.

        Raises:
            ServiceUnavailableError: 503 ``files_unavailable`` (the database).
            OSError: the store cannot write.
            sqlalchemy.exc.SQLAlchemyError: the row could not be added (the content is
                removed again).
        """
        catalog = await self.catalog()
        file_id = "file-" + uuid.uuid4().hex
        blob = await asyncio.to_thread(self.store.put, file_id, io.BytesIO(data))
        row = FileRow(
            id=file_id,
            owner=owner,
            filename=filename,
            purpose=purpose,
            bytes=blob.size,
            created_at=datetime.now(UTC),
            sha256=blob.sha256,
            storage_key=file_id,
        )
        try:
            await catalog.add(row)
        except BaseException:
            await asyncio.to_thread(self.store.delete, file_id)
            raise
        return row

    async def close(self) -> None:
        """Dispose of the database engine (when one was opened)."""
        if self._catalog is not None:
            await self._catalog.engine.dispose()
            self._catalog = None
