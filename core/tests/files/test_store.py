"""The directory file store (:mod:`servehall.files.store`) and the ``file_object``
catalog (:mod:`servehall.files.catalog`) on a migrated SQLite and PostgreSQL database."""

from __future__ import annotations

import hashlib
import io
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from servehall.db import create_db_engine
from servehall.files.catalog import FileCatalog, FileRow, UnknownCursor
from servehall.files.store import CHUNK, DirectoryStore, FileStore


class _Boom(io.BytesIO):
    def read(self, n: int | None = -1) -> bytes:
        if self.tell() >= CHUNK:
            raise OSError("disk went away")
        return super().read(n)


def test_directory_store_put_open_delete(tmp_path: Path) -> None:
    store: FileStore = DirectoryStore(tmp_path / "files")
    data = b"x" * (CHUNK + 17)
    blob = store.put("file-1", io.BytesIO(data))
    assert blob.size == len(data) and blob.sha256 == hashlib.sha256(data).hexdigest()
    with store.open("file-1") as f:
        assert f.read() == data
    blob = store.put("file-1", io.BytesIO(b"new"))  # replaced whole
    with store.open("file-1") as f:
        assert f.read() == b"new"
    store.delete("file-1")
    store.delete("file-1")  # nothing there: no error
    with pytest.raises(FileNotFoundError):
        store.open("file-1")
    assert list((tmp_path / "files").iterdir()) == []


def test_failed_put_leaves_nothing(tmp_path: Path) -> None:
    store = DirectoryStore(tmp_path)
    store.put("keep", io.BytesIO(b"old"))
    with pytest.raises(OSError):
        store.put("keep", _Boom(b"y" * (CHUNK * 2)))
    assert [p.name for p in tmp_path.iterdir()] == ["keep"]  # no temp file left
    assert (tmp_path / "keep").read_bytes() == b"old"


@pytest.mark.parametrize("key", ["", "../x", "a/b", "a b", ".", "x" * 201])
def test_keys_are_names_not_paths(tmp_path: Path, key: str) -> None:
    store = DirectoryStore(tmp_path)
    with pytest.raises(ValueError):
        store.put(key, io.BytesIO(b"x"))
    with pytest.raises(ValueError):
        store.open(key)


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
