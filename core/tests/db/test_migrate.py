"""servehall.db.migrate: the schema check's retry on a locked SQLite file, and
open_checked (the engine of a service that opens the database on first use)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import exc as sa_exc

from servehall import ConfigError
from servehall.config.settings import Settings
from servehall.db import create_db_engine, migrate
from servehall.db.migrate import ensure_schema, open_checked, pending_heads


def _error(message: str) -> sa_exc.OperationalError:
    return sa_exc.OperationalError("SELECT", {}, Exception(message))


def _failing(monkeypatch: pytest.MonkeyPatch, message: str, times: int) -> list[int]:
    """Make the schema check's first ``times`` reads fail with ``message``; the returned
    list holds the number of reads tried."""
    calls = [0]

    async def read(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        if calls[0] <= times:
            raise _error(message)
        return await pending_heads(*args, **kwargs)

    monkeypatch.setattr(migrate, "pending_heads", read)
    return calls


@pytest.mark.parametrize(
    ("message", "times", "tries", "raised"),
    [
        ("database is locked", 1, 2, None),  # retried, then the check passes
        ("database is locked", 99, migrate.LOCKED_ATTEMPTS, "database is locked"),
        ("disk I/O error", 99, 1, "disk I/O error"),  # other errors are not retried
    ],
    ids=["locked-once", "stays-locked", "other-error"],
)
async def test_a_locked_file_is_retried(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    message: str,
    times: int,
    tries: int,
    raised: str | None,
) -> None:
    engine = create_db_engine(f"sqlite+aiosqlite:///{tmp_path / 'r.db'}")
    calls = _failing(monkeypatch, message, times)
    if raised is None:
        await ensure_schema(engine, auto_migrate=True)
    else:
        with pytest.raises(ConfigError, match=raised):
            await ensure_schema(engine, auto_migrate=True)
    assert calls[0] >= tries if raised is None else calls[0] == tries
    await engine.dispose()


async def test_open_checked_migrates_or_refuses(tmp_path: Path) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'r.db'}"
    refused = Settings.model_validate({"database": {"url": url, "auto_migrate": False}})
    with pytest.raises(ConfigError, match="not migrated"):
        await open_checked(refused)
    ok = Settings.model_validate({"database": {"url": url, "auto_migrate": True}})
    engine = await open_checked(ok)
    assert not await pending_heads(engine)
    await engine.dispose()


async def test_schema_checks_interleaved_in_one_process(tmp_path: Path) -> None:
    """Several services check (and migrate) their databases at once on one event loop:
    Alembic's module-global context must not be shared between the runs (it was:
    ``KeyError: 'script'`` in a CI run, a 503 on the first ``/v1/responses``)."""
    engines = [create_db_engine(f"sqlite+aiosqlite:///{tmp_path / f'r{i}.db'}") for i in range(4)]
    try:
        await asyncio.gather(*(ensure_schema(e, auto_migrate=True) for e in engines))
        missing = await asyncio.gather(*(pending_heads(e) for e in engines))
        assert missing == [set()] * len(engines)
    finally:
        for e in engines:
            await e.dispose()
