"""The metadata of uploaded files: the ``file_object`` table of the records database.

Every call names the owner: a file is found only by the principal that uploaded it, so
another principal's id reads exactly like an unknown one.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from sqlalchemy import Table, delete, insert, select
from sqlalchemy.ext.asyncio import AsyncEngine

from servehall.db.models import FileObject as FileTable
from servehall.files.wire import FileObject

_T: Table = FileTable.__table__  # type: ignore[assignment]


@dataclass(frozen=True, slots=True)
class FileRow:
    """One ``file_object`` row (``created_at`` UTC; ``bytes`` the content's size)."""

    id: str
    owner: str
    filename: str
    purpose: str
    bytes: int
    created_at: datetime
    sha256: str
    storage_key: str

    def wire(self) -> dict[str, Any]:
        """OpenAI's file object (:class:`~servehall.files.wire.FileObject`): ``{id,
        object: "file", bytes, created_at (Unix s), filename, purpose, status:
        "processed", status_details: null}``."""
        return FileObject(
            id=self.id,
            bytes=self.bytes,
            created_at=int(self.created_at.timestamp()),
            filename=self.filename,
            purpose=self.purpose,
        ).model_dump(mode="json")


def _row(r: Any) -> FileRow:
    return FileRow(
        id=str(r.id),
        owner=str(r.owner),
        filename=str(r.filename),
        purpose=str(r.purpose),
        bytes=int(r.bytes),
        created_at=r.created_at,
        sha256=str(r.sha256),
        storage_key=str(r.storage_key),
    )


_COLUMNS = (
    _T.c.id,
    _T.c.owner,
    _T.c.filename,
    _T.c.purpose,
    _T.c.bytes,
    _T.c.created_at,
    _T.c.sha256,
    _T.c.storage_key,
)


class UnknownCursor(LookupError):
    """``after`` names no file of this owner."""


class FileCatalog:
    """``file_object`` rows through ``engine`` (SQLite or PostgreSQL)."""

    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine

    async def add(self, row: FileRow) -> None:
        """Insert ``row`` (its ``id`` must be new)."""
        values = {c.name: getattr(row, c.name) for c in _COLUMNS}
        values["created_at"] = row.created_at.astimezone(UTC)
        async with self.engine.begin() as conn:
            await conn.execute(insert(_T).values(**values))

    async def get(self, file_id: str, owner: str) -> FileRow | None:
        """The file ``file_id`` when ``owner`` owns it, else None."""
        q = select(*_COLUMNS).where(_T.c.id == file_id, _T.c.owner == owner)
        async with self.engine.connect() as conn:
            r = (await conn.execute(q)).first()
        return None if r is None else _row(r)

    async def list(
        self,
        owner: str,
        *,
        purpose: str | None = None,
        after: str | None = None,
        limit: int = 10_000,
        order: Literal["asc", "desc"] = "desc",
    ) -> tuple[list[FileRow], bool]:
        """``owner``'s files, newest first (``order = "desc"``) or oldest first, only
        those of ``purpose`` when given, starting after the file ``after``; at most
        ``limit``. Answers the rows and whether more follow.

        Raises:
            UnknownCursor: ``after`` names no file of ``owner``.
        """
        async with self.engine.connect() as conn:
            q = select(_T.c.seq, *_COLUMNS).where(_T.c.owner == owner)
            if after is not None:
                seq = (
                    await conn.execute(
                        select(_T.c.seq).where(_T.c.id == after, _T.c.owner == owner)
                    )
                ).scalar()
                if seq is None:
                    raise UnknownCursor(after)
                q = q.where(_T.c.seq > seq if order == "asc" else _T.c.seq < seq)
            if purpose is not None:
                q = q.where(_T.c.purpose == purpose)
            q = q.order_by(_T.c.seq.asc() if order == "asc" else _T.c.seq.desc())
            rows = (await conn.execute(q.limit(limit + 1))).all()
        return [_row(r) for r in rows[:limit]], len(rows) > limit

    async def remove(self, file_id: str, owner: str) -> FileRow | None:
        """Delete the row of ``file_id`` when ``owner`` owns it; the row deleted, or None."""
        async with self.engine.begin() as conn:
            r = (
                await conn.execute(select(*_COLUMNS).where(_T.c.id == file_id, _T.c.owner == owner))
            ).first()
            if r is None:
                return None
            await conn.execute(delete(_T).where(_T.c.id == file_id, _T.c.owner == owner))
        return _row(r)
