"""The soak's options (servehall.bench.soak.options): the faults a deployment cannot have
are refused before the run starts, and the database a started server will write to is
known beforehand."""

from __future__ import annotations

from pathlib import Path

import pytest

from servehall.bench.soak.options import (
    SoakError,
    SoakOptions,
    check_fault_options,
    planned_database_url,
)

PG = "postgresql+asyncpg://u:p@127.0.0.1:5999/db"


def _config(tmp_path: Path, text: str) -> Path:
    cfg = tmp_path / "soak.toml"
    cfg.write_text(text)
    return cfg


@pytest.mark.parametrize("fault", ["db-stop", "db-restart"])
def test_database_faults_are_refused_on_sqlite(fault: str, tmp_path: Path) -> None:
    # the demo soak without --config writes to a SQLite file
    with pytest.raises(SoakError, match="SQLite"):
        check_fault_options(SoakOptions(faults=(fault,), workdir=tmp_path))
    cfg = _config(tmp_path, 'sinks = []\n[database]\nurl = "sqlite+aiosqlite:///r.db"\n')
    with pytest.raises(SoakError, match="SQLite"):
        check_fault_options(SoakOptions(faults=(fault,), config=cfg))


def test_database_faults_on_postgresql_are_accepted(tmp_path: Path) -> None:
    cfg = _config(tmp_path, f'[database]\nurl = "{PG}"\n')
    check_fault_options(SoakOptions(faults=("db-stop", "db-restart"), config=cfg))


def test_api_kill_and_api_processes(tmp_path: Path) -> None:
    with pytest.raises(SoakError, match="api-kill needs frontend processes"):
        check_fault_options(SoakOptions(faults=("api-kill",), workdir=tmp_path))
    check_fault_options(SoakOptions(faults=("api-kill",), workdir=tmp_path, api_processes=2))
    with pytest.raises(SoakError, match="at least 1"):
        check_fault_options(SoakOptions(api_processes=0))
    with pytest.raises(SoakError, match="a server the soak starts"):
        check_fault_options(SoakOptions(url="http://127.0.0.1:1", api_processes=2))


def test_no_fault_is_always_accepted() -> None:
    check_fault_options(SoakOptions(url="http://127.0.0.1:1"))


def test_the_planned_database(tmp_path: Path) -> None:
    assert planned_database_url(SoakOptions(db_url=PG)) == PG
    assert planned_database_url(SoakOptions()) == "sqlite+aiosqlite:///servehall.db"
    assert planned_database_url(SoakOptions(url="http://127.0.0.1:1")) is None
    cfg = _config(tmp_path, f'[database]\nurl = "{PG}"\n')
    assert planned_database_url(SoakOptions(config=cfg)) == PG
