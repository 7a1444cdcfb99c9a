"""``servehall.responses.store``: stored responses on a real SQLite file — found only by
their owner, invisible once expired and purged by the next store, removed once, and a
503 ``responses_unavailable`` (never a 500) when the database is not usable."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

from servehall.config.settings import Settings, load_settings
from servehall.errors import ServiceUnavailableError
from servehall.responses.store import UNAVAILABLE, ResponseStore, StoredResponse


def _settings(tmp_path: Path, **responses: Any) -> Settings:
    return load_settings(
        data={
            "database": {
                "url": f"sqlite+aiosqlite:///{tmp_path / 'r.db'}",
                "auto_migrate": True,
            },
            "responses": responses,
        }
    )


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[ResponseStore]:
    s = ResponseStore(_settings(tmp_path))
    yield s
    await s.close()


def _body(rid: str) -> dict[str, Any]:
    return {"id": rid, "object": "response", "model": "demo", "output": [{"text": "é"}]}


async def test_put_get_owner_only(store: ResponseStore) -> None:
    assert store.enabled
    items = [{"role": "user", "content": "hi"}]
    await store.put("alice", _body("resp_1"), items)
    got = await store.get("resp_1", "alice")
    assert got == StoredResponse("resp_1", "alice", _body("resp_1"), items)
    assert await store.get("resp_1", "bob") is None
    assert await store.get("resp_unknown", "alice") is None


async def test_remove_once_and_by_owner_only(store: ResponseStore) -> None:
    await store.put("alice", _body("resp_1"), [])
    assert await store.remove("resp_1", "bob") is False
    assert await store.remove("resp_1", "alice") is True
    assert await store.remove("resp_1", "alice") is False
    assert await store.get("resp_1", "alice") is None


async def test_expired_rows_are_invisible_and_purged(store: ResponseStore) -> None:
    await store.put("alice", _body("resp_old"), [])
    engine = await store.engine()
    async with engine.begin() as conn:
        await conn.execute(
            text("UPDATE response_object SET expires_at = '2000-01-01 00:00:00.000000'")
        )
    assert await store.get("resp_old", "alice") is None
    assert await store.remove("resp_old", "alice") is False
    await store.put("alice", _body("resp_new"), [])
    async with engine.connect() as conn:
        ids = [r.id for r in await conn.execute(text("SELECT id FROM response_object"))]
    assert ids == ["resp_new"]


async def test_retention_sets_expiry(tmp_path: Path) -> None:
    s = ResponseStore(_settings(tmp_path, retention_days=0.5))
    try:
        await s.put("alice", _body("resp_1"), [])
        engine = await s.engine()
        async with engine.connect() as conn:
            row = (
                await conn.execute(
                    text(
                        "SELECT julianday(expires_at) - julianday(created_at) AS d"
                        " FROM response_object"
                    )
                )
            ).one()
        assert row.d == pytest.approx(0.5, abs=1e-6)
    finally:
        await s.close()


async def test_duplicate_id_is_a_503_not_a_500(store: ResponseStore) -> None:
    await store.put("alice", _body("resp_1"), [])
    with pytest.raises(ServiceUnavailableError) as info:
        await store.put("alice", _body("resp_1"), [])
    assert info.value.code == UNAVAILABLE and info.value.status == 503
    assert info.value.headers == {"Retry-After": "5"}


async def test_unmigrated_database_is_a_503_and_retried(tmp_path: Path) -> None:
    settings = load_settings(data={"database": {"url": f"sqlite+aiosqlite:///{tmp_path / 'r.db'}"}})
    s = ResponseStore(settings)
    with pytest.raises(ServiceUnavailableError) as info:
        await s.get("resp_1", "alice")
    assert info.value.code == UNAVAILABLE
    assert "Response storage is unavailable" in info.value.message
    assert s._engine is None  # nothing kept: the next call tries again
    await s.close()


async def test_store_disabled(tmp_path: Path) -> None:
    assert not ResponseStore(_settings(tmp_path, store=False)).enabled
