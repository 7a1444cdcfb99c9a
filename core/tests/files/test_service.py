"""``servehall.files.service``: the catalog opened on first use (a 503
``files_unavailable`` naming the cause, retried on the next call, when the database is
not migrated), and :meth:`FileService.add_bytes` storing content and row together."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.exc import SQLAlchemyError

from servehall.config.settings import Settings, load_settings
from servehall.errors import ServiceUnavailableError
from servehall.files.service import UNAVAILABLE, FileService


def _settings(tmp_path: Path, auto_migrate: bool = True, **files: Any) -> Settings:
    return load_settings(
        data={
            "database": {
                "url": f"sqlite+aiosqlite:///{tmp_path / 'f.db'}",
                "auto_migrate": auto_migrate,
            },
            "files": {"dir": str(tmp_path / "files"), **files},
        }
    )


async def test_add_bytes_stores_content_and_row(tmp_path: Path) -> None:
    svc = FileService(_settings(tmp_path, max_bytes=123))
    try:
        assert svc.max_bytes == 123
        row = await svc.add_bytes("alice", "out.jsonl", "batch_output", b'{"a": 1}\n')
        assert row.id.startswith("file-") and row.storage_key == row.id
        assert row.bytes == 9 and row.sha256 == hashlib.sha256(b'{"a": 1}\n').hexdigest()
        assert (tmp_path / "files" / row.id).read_bytes() == b'{"a": 1}\n'
        catalog = await svc.catalog()
        assert await catalog.get(row.id, "alice") == row
        assert await svc.catalog() is catalog  # opened once
        other = await svc.add_bytes("alice", "out.jsonl", "batch_output", b"")
        assert other.id != row.id and other.bytes == 0
    finally:
        await svc.close()
    assert svc._catalog is None


async def test_failed_row_removes_the_content(tmp_path: Path) -> None:
    svc = FileService(_settings(tmp_path))
    try:
        catalog = await svc.catalog()
        async with catalog.engine.begin() as conn:
            await conn.execute(text("DROP TABLE file_object"))
        with pytest.raises(SQLAlchemyError):
            await svc.add_bytes("alice", "x", "batch_output", b"data")
        assert list((tmp_path / "files").iterdir()) == []
    finally:
        await svc.close()


async def test_unmigrated_database_is_a_503_then_retried(tmp_path: Path) -> None:
    svc = FileService(_settings(tmp_path, auto_migrate=False))
    with pytest.raises(ServiceUnavailableError) as info:
        await svc.catalog()
    assert info.value.code == UNAVAILABLE and info.value.status == 503
    assert info.value.headers == {"Retry-After": "5"}
    assert info.value.message.startswith("File storage is unavailable: ")
    assert svc._catalog is None
    # Migrated meanwhile: the next call opens it.
    from servehall.db import create_db_engine
    from servehall.db.migrate import upgrade_database

    engine = create_db_engine(f"sqlite+aiosqlite:///{tmp_path / 'f.db'}")
    await upgrade_database(engine)
    await engine.dispose()
    try:
        assert await svc.catalog() is not None
    finally:
        await svc.close()
