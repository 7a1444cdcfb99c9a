"""Fixtures for the core's unit tests."""

from __future__ import annotations

import os
import sys
import textwrap
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest


@pytest.fixture
def install_plugin(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Callable[..., Path]]:
    """Install a real plugin distribution (dist-info + module) on a temporary sys.path entry.

    ``install_plugin(name, source, dist="servehall-x", version="1.0")`` writes
    ``<module>.py`` with ``source`` and an ``entry_points.txt`` registering ``name`` in the
    ``servehall`` group, exactly as pip would, so ``importlib.metadata`` finds it.
    """
    site = tmp_path / "site"
    site.mkdir()
    monkeypatch.syspath_prepend(str(site))
    made: list[str] = []

    def install(name: str, source: str, dist: str | None = None, version: str = "1.0") -> Path:
        dist = dist or f"servehall-test-{name}"
        module = f"servehall_test_{name}"
        (site / f"{module}.py").write_text(textwrap.dedent(source))
        info = site / f"{dist.replace('-', '_')}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
        (info / "entry_points.txt").write_text(f"[servehall]\n{name} = {module}\n")
        made.append(module)
        return site

    yield install
    for module in made:
        sys.modules.pop(module, None)


@pytest.fixture(scope="session")
def ort_cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One ONNX Runtime GenAI build cache per session (the tiny Llama is built once)."""
    return tmp_path_factory.mktemp("onnxruntime-cache")


@pytest.fixture(params=["sqlite", "postgresql"])
async def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[str]:
    """An empty database: a SQLite file, then a fresh PostgreSQL database (skips without
    PostgreSQL; fails under CI), dropped after."""
    from servehall.db.testing import create_pg_database, drop_pg_database, require_pg

    if request.param == "sqlite":
        yield f"sqlite+aiosqlite:///{tmp_path / 'records.db'}"
        return
    url = await create_pg_database(require_pg())
    try:
        yield url
    finally:
        await drop_pg_database(url)


@pytest.fixture
async def migrated(db_url: str) -> str:
    """The URL of a database (:func:`db_url`) upgraded to the core's head revision."""
    from servehall.db import create_db_engine
    from servehall.db.migrate import upgrade_database

    engine = create_db_engine(db_url)
    await upgrade_database(engine)
    await engine.dispose()
    return db_url


@pytest.fixture
def here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A fresh working directory without ``$SERVEHALL_CONFIG`` or ``$SERVEHALL_DATABASE*``
    (for CLI tests that read ``./servehall.toml``)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("SERVEHALL_CONFIG", raising=False)
    for key in list(os.environ):
        if key.startswith("SERVEHALL_DATABASE"):
            monkeypatch.delenv(key)
    yield tmp_path


@pytest.fixture
def redis() -> Iterator[Any]:
    """A real redis-server on a free loopback port (``.url``, ``.stop()``, ``.start()``:
    the auth plugin's ``RedisServer``); skips without the plugin or the binary."""
    testing = pytest.importorskip("servehall_auth.testing")
    if testing.redis_server_binary() is None:
        pytest.skip("redis-server is not installed (.ci/services.d/redis.sh)")
    server = testing.RedisServer().start()
    yield server
    server.close()
