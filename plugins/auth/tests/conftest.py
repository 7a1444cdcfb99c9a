"""Fixtures for the auth plugin's unit tests: a real SQLite file and, when
``SERVEHALL_TEST_PG_URL`` (or the CI default) answers, a real PostgreSQL database
created for this session and dropped afterwards."""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from sqlalchemy.engine import make_url

from servehall.db.testing import pg_execute

PG_DEFAULT = "postgresql+asyncpg://servehall:servehall@127.0.0.1:55432/servehall_test"


def _pg_base_url() -> str:
    return os.environ.get("SERVEHALL_TEST_PG_URL", PG_DEFAULT)


@pytest.fixture(scope="session")
def pg_url() -> Iterator[str]:
    """A fresh PostgreSQL database URL (skips when no server answers)."""
    base = _pg_base_url()
    name = f"servehall_auth_{uuid.uuid4().hex[:10]}"
    try:
        asyncio.run(pg_execute(base, f'CREATE DATABASE "{name}"', timeout=5))
    except Exception as exc:  # no server here
        pytest.skip(f"PostgreSQL not available ({type(exc).__name__}); run .ci/services.sh")
    url = make_url(base).set(database=name).render_as_string(hide_password=False)
    yield url
    asyncio.run(pg_execute(base, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)', timeout=5))


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A database URL: a SQLite file, or the session's PostgreSQL database."""
    if request.param == "sqlite":
        return f"sqlite+aiosqlite:///{tmp_path / 'auth.db'}"
    return str(request.getfixturevalue("pg_url"))


@pytest.fixture
async def keystore(db_url: str) -> AsyncIterator[object]:
    """A KeyStore on a fresh ``api_key`` table (created from the table mirror)."""
    from servehall_auth.store import KeyStore, api_key, make_engine, metadata

    engine = make_engine(db_url)
    async with engine.begin() as conn:
        await conn.run_sync(lambda c: metadata.drop_all(c, tables=[api_key]))
        await conn.run_sync(lambda c: metadata.create_all(c, tables=[api_key]))
    store = KeyStore(engine, "unit-test-pepper-0123456789")
    yield store
    await engine.dispose()
