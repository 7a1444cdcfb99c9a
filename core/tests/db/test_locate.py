"""``servehall.db.locate``: which database a command uses, named with its password
masked, and a SQLite file that does not exist refused instead of created."""

from __future__ import annotations

from pathlib import Path

import pytest

from servehall.db.locate import (
    config_source,
    describe_database,
    require_existing_database,
    sqlite_path,
)
from servehall.errors import ConfigError


def test_sqlite_paths_are_absolute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert sqlite_path("sqlite:///rel.db") == tmp_path / "rel.db"
    assert sqlite_path("sqlite+aiosqlite:////abs/x.db") == Path("/abs/x.db")


@pytest.mark.parametrize(
    "url",
    [
        "sqlite://",
        "sqlite:///:memory:",
        "sqlite:///file:mem?mode=memory&uri=true",
        "postgresql://u@h/db",
        "::not a url::",
    ],
)
def test_no_path_for_other_databases_or_memory(url: str) -> None:
    assert sqlite_path(url) is None


def test_describe_masks_the_password_and_resolves_sqlite(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert (
        describe_database("sqlite+aiosqlite:///r.db") == f"sqlite+aiosqlite:///{tmp_path / 'r.db'}"
    )
    text = describe_database("postgresql+asyncpg://app:s3cret@db:5432/servehall")
    assert "s3cret" not in text and "app:***@db:5432/servehall" in text


def test_config_source(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SERVEHALL_CONFIG", raising=False)
    assert config_source("a.toml") == "config a.toml"
    assert config_source(None) == "no --config: built-in defaults"
    monkeypatch.setenv("SERVEHALL_CONFIG", "/etc/sh.toml")
    assert config_source(None) == "config /etc/sh.toml ($SERVEHALL_CONFIG)"


def test_a_missing_sqlite_file_is_refused_and_not_created(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SERVEHALL_CONFIG", raising=False)
    db = tmp_path / "servehall.db"
    with pytest.raises(ConfigError) as err:
        require_existing_database(f"sqlite:///{db}", config="s.toml")
    text = str(err.value)
    assert str(db) in text and "(config s.toml)" in text and "servehall db upgrade" in text
    assert not db.exists()
    db.touch()
    require_existing_database(f"sqlite:///{db}")
    require_existing_database("postgresql://u@h/none")  # not checked here
