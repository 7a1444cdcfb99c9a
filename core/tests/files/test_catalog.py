"""The ``file_object`` catalog (:mod:`servehall.files.catalog`) on a migrated SQLite and
PostgreSQL database: owner-only reads, pages in both orders, purpose filter, cursors,
removal."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta, timezone

import pytest

from servehall.db import create_db_engine
from servehall.files.catalog import FileCatalog, FileRow, UnknownCursor


def _row(n: int, owner: str, purpose: str = "batch") -> FileRow:
    return FileRow(
        id=f"file-{n:03d}",
        owner=owner,
        filename=f"in-{n}.jsonl",
        purpose=purpose,
        bytes=n,
        created_at=datetime(2026, 12, 1, tzinfo=UTC) + timedelta(seconds=n),
        sha256="0" * 64,
        storage_key=f"file-{n:03d}",
    )


async def test_catalog_owner_pages_and_delete(migrated: str) -> None:
    engine = create_db_engine(migrated)
    try:
        cat = FileCatalog(engine)
        for n in range(1, 6):
            await cat.add(_row(n, "alice", "batch" if n != 3 else "other"))
        await cat.add(_row(9, "bob"))
        got = await cat.get("file-002", "alice")
        assert got == _row(2, "alice")
        assert got is not None and got.wire()["created_at"] == int(got.created_at.timestamp())
        assert await cat.get("file-009", "alice") is None  # bob's
        rows, more = await cat.list("alice")
        assert [r.id for r in rows] == ["file-005", "file-004", "file-003", "file-002", "file-001"]
        assert not more
        rows, more = await cat.list("alice", limit=2, order="asc")
        assert [r.id for r in rows] == ["file-001", "file-002"] and more
        rows, more = await cat.list("alice", after="file-002", limit=2, order="asc")
        assert [r.id for r in rows] == ["file-003", "file-004"] and more
        rows, more = await cat.list("alice", after="file-004", purpose="batch")
        assert [r.id for r in rows] == ["file-002", "file-001"] and not more
        with pytest.raises(UnknownCursor):
            await cat.list("alice", after="file-009")
        assert await cat.remove("file-009", "alice") is None
        removed = await cat.remove("file-002", "alice")
        assert removed is not None and removed.id == "file-002"
        assert await cat.get("file-002", "alice") is None
        assert await cat.remove("file-002", "alice") is None
    finally:
        await engine.dispose()


def test_wire_is_openais_file_object() -> None:
    row = _row(7, "alice")
    assert row.wire() == {
        "id": "file-007",
        "object": "file",
        "bytes": 7,
        "created_at": int(datetime(2026, 12, 1, 0, 0, 7, tzinfo=UTC).timestamp()),
        "filename": "in-7.jsonl",
        "purpose": "batch",
        "status": "processed",
        "status_details": None,
    }


async def test_catalog_cursor_in_descending_order_and_other_owner(migrated: str) -> None:
    engine = create_db_engine(migrated)
    try:
        cat = FileCatalog(engine)
        for n in range(1, 5):
            await cat.add(_row(n, "alice"))
        rows, more = await cat.list("alice", after="file-003", limit=1)
        assert [r.id for r in rows] == ["file-002"] and more
        rows, more = await cat.list("alice", after="file-001")
        assert rows == [] and not more
        # Another owner's cursor reads like an unknown one.
        await cat.add(_row(8, "bob"))
        with pytest.raises(UnknownCursor):
            await cat.list("alice", after="file-008")
        assert (await cat.list("bob"))[0] == [_row(8, "bob")]
        # created_at is stored as the same instant, whatever zone it was given in.
        plus2 = timezone(timedelta(hours=2))
        late = _row(9, "carol")
        await cat.add(replace(late, created_at=late.created_at.astimezone(plus2)))
        got = await cat.get("file-009", "carol")
        assert got is not None and got.created_at.timestamp() == late.created_at.timestamp()
    finally:
        await engine.dispose()
