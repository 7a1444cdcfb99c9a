"""servehall.db.migrate: the schema check's retry on a locked SQLite file, and
open_checked (the engine of a service that opens the database on first use)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import exc as sa_exc

from servehall import ConfigError
from servehall.config.settings import Settings
from servehall.db import create_db_engine, migrate
from servehall.db.migrate import ensure_schema, open_checked, pending_heads


def _locked() -> sa_exc.OperationalError:
    return sa_exc.OperationalError("SELECT", {}, Exception("database is locked"))


async def test_a_locked_file_is_retried(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    engine = create_db_engine(f"sqlite+aiosqlite:///{tmp_path / 'r.db'}")
    calls = 0

    async def flaky(*args: Any, **kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise _locked()
        return await pending_heads(*args, **kwargs)

    monkeypatch.setattr(migrate, "pending_heads", flaky)
    await ensure_schema(engine, auto_migrate=True)
    assert calls >= 2
    await engine.dispose()


async def test_a_file_that_stays_locked_is_a_config_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = create_db_engine(f"sqlite+aiosqlite:///{tmp_path / 'r.db'}")
    calls = 0

    async def locked(*args: Any, **kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        raise _locked()

    monkeypatch.setattr(migrate, "pending_heads", locked)
    with pytest.raises(ConfigError, match="database is locked"):
        await ensure_schema(engine, auto_migrate=True)
    assert calls == migrate.LOCKED_ATTEMPTS
    await engine.dispose()


async def test_other_errors_are_not_retried(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = create_db_engine(f"sqlite+aiosqlite:///{tmp_path / 'r.db'}")
    calls = 0

    async def broken(*args: Any, **kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        raise sa_exc.OperationalError("SELECT", {}, Exception("disk I/O error"))

    monkeypatch.setattr(migrate, "pending_heads", broken)
    with pytest.raises(ConfigError, match="disk I/O error"):
        await ensure_schema(engine, auto_migrate=True)
    assert calls == 1
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
