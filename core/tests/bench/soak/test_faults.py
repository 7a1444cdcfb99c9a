"""``servehall bench soak --faults``: which faults a deployment can have, refused in one
line when it cannot (a database fault on SQLite, ``redis-restart`` without Redis or
without its command, any fault against a server the soak did not start), and the SIGSTOP
of a process group that always ends in SIGCONT. The faults themselves run in a manual
soak against a throwaway PostgreSQL (docs/performance.md), not in the suite."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from servehall.bench.soak.faults import (
    FAULTS,
    FaultError,
    check_faults,
    database_kind,
    redis_urls,
    stop_processes,
)
from servehall.cli import build_cli
from servehall.config.settings import load_settings

PG = "postgresql+asyncpg://u:p@127.0.0.1:5999/db"


def _config(tmp_path: Path, text: str) -> Path:
    cfg = tmp_path / "soak.toml"
    cfg.write_text(text)
    return cfg


def test_every_fault_is_known_and_unknown_ones_are_refused() -> None:
    assert set(FAULTS) == {
        "worker-kill",
        "worker-stop",
        "db-stop",
        "db-restart",
        "redis-restart",
        "api-kill",
    }
    with pytest.raises(FaultError, match="unknown fault 'db-melt'; known: worker-kill"):
        check_faults(["db-melt"], starts_server=True, db_url=PG)
    check_faults([], starts_server=False, db_url=None)  # no fault: nothing to check


def test_faults_need_a_server_the_soak_starts() -> None:
    with pytest.raises(FaultError, match="needs a server the soak starts"):
        check_faults(["worker-kill"], starts_server=False, db_url=PG)


def test_api_kill_needs_two_api_processes() -> None:
    sqlite = "sqlite+aiosqlite:///x.db"
    with pytest.raises(FaultError, match=r"api-kill needs frontend processes.*got 1"):
        check_faults(["api-kill"], starts_server=True, db_url=sqlite)
    check_faults(["api-kill", "worker-kill"], starts_server=True, db_url=sqlite, api_processes=2)


@pytest.mark.parametrize("fault", ["db-stop", "db-restart"])
def test_database_faults_are_refused_on_sqlite(fault: str) -> None:
    with pytest.raises(FaultError, match=f"{fault} needs a PostgreSQL server.*SQLite"):
        check_faults([fault], starts_server=True, db_url="sqlite+aiosqlite:///x.db")
    with pytest.raises(FaultError, match="unknown"):
        check_faults([fault], starts_server=True, db_url=None)


def test_database_faults_on_postgresql_are_accepted() -> None:
    check_faults(["db-stop", "db-restart", "worker-stop"], starts_server=True, db_url=PG)
    assert database_kind(PG) == "postgresql" and database_kind("sqlite:///a") == "sqlite"
    with pytest.raises(FaultError, match="--db-pid must be a process id"):
        check_faults(["db-stop"], starts_server=True, db_url=PG, db_pid=0)
    with pytest.raises(FaultError, match="--fault-stop must be in"):
        check_faults(["db-stop"], starts_server=True, db_url=PG, stop_s=0)


def test_redis_restart_needs_redis_and_its_command(tmp_path: Path) -> None:
    plain = load_settings(_config(tmp_path, f'[database]\nurl = "{PG}"\n'))
    assert redis_urls(plain) == []
    with pytest.raises(FaultError, match="uses no Redis"):
        check_faults(["redis-restart"], starts_server=True, db_url=PG, redis=[])
    broadcast = load_settings(
        _config(tmp_path, '[server]\nconfig_broadcast_url = "redis://127.0.0.1:6399/0"\n')
    )
    assert redis_urls(broadcast) == ["server.config_broadcast_url"]
    auth = load_settings(
        _config(tmp_path, '[auth]\nlimits_url = "redis://127.0.0.1:6399/1"\npepper = "x"\n')
    )
    assert redis_urls(auth) == ["auth.limits_url"]
    with pytest.raises(FaultError, match=r"needs --redis-restart-cmd.*auth\.limits_url"):
        check_faults(["redis-restart"], starts_server=True, db_url=PG, redis=["auth.limits_url"])
    check_faults(
        ["redis-restart"],
        starts_server=True,
        db_url=PG,
        redis=["auth.limits_url"],
        redis_restart_cmd="true",
    )


def test_the_cli_refuses_a_database_fault_on_the_demo_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("SERVEHALL_CONFIG", raising=False)
    args = ["bench", "soak", "--demo", "--faults", "db-stop", "--duration", "5"]
    res = CliRunner().invoke(build_cli(args), args)
    assert res.exit_code == 2, res.output
    assert "db-stop needs a PostgreSQL server" in res.stderr and "SQLite" in res.stderr
    assert "Traceback" not in res.output


def test_a_stopped_process_group_is_always_continued() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:

        def state() -> str:
            for line in Path(f"/proc/{proc.pid}/status").read_text().splitlines():
                if line.startswith("State:"):
                    return line.split()[1]
            return "?"

        async def main() -> str:
            task = asyncio.create_task(stop_processes([proc.pid, 2**22 + 1], 10.0))
            await asyncio.sleep(0.3)
            stopped = state()
            task.cancel()  # the soak ends mid-fault: SIGCONT still comes
            with pytest.raises(asyncio.CancelledError):
                await task
            return stopped

        assert asyncio.run(main()) == "T"
        assert state() in ("S", "R")
    finally:
        proc.kill()
        proc.wait()


def test_the_postmaster_is_found_from_the_database() -> None:
    """Only read, never signalled: the parent of the backend of a connection to the
    shared test server is its postmaster (the process ``db-stop`` would stop)."""
    from servehall.bench.soak.faults import postmaster_pid
    from servehall.db.testing import require_pg

    pid = asyncio.run(postmaster_pid(require_pg()))
    cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    assert cmd[0].endswith(b"postgres"), cmd
    with pytest.raises(FaultError, match="cannot ask the database"):
        asyncio.run(postmaster_pid("postgresql+asyncpg://u:p@127.0.0.1:1/nope"))
