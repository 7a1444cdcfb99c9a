"""Issue #13 §3 for the auth plugin: ``keys`` commands through the real CLI (a
subprocess) give one error line for a missing, un-migrated or unreachable database and
never create one; ``keys create`` prints no ``None``; each key records its pepper's
fingerprint and the server's auth runtime warns at start when no active key matches the
configured pepper (the pepper was lost or changed)."""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import SecretStr

from servehall.testing.cli import run_cli
from servehall_auth.keys import pepper_fingerprint

PEPPER = "operator-pepper-0123456789"


def _config(tmp_path: Path, url: str, pepper_file: Path | None = None) -> Path:
    pepper_file = pepper_file or tmp_path / "pepper"
    if not pepper_file.exists():
        pepper_file.write_text(PEPPER + "\n")
    config = tmp_path / "servehall.toml"
    config.write_text(
        "sinks = []\n"
        '[plugins]\nenabled = ["auth"]\n'
        f'[database]\nurl = "{url}"\n'
        f'[auth]\npepper = {{ file = "{pepper_file}" }}\n'
    )
    return config


def _cli(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return run_cli(config, *args, cwd=config.parent, unset=("SERVEHALL_DATABASE",))


def _one_error_line(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stdout + proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    return lines[0]


@pytest.mark.parametrize("args", [("keys", "list"), ("keys", "create", "--tenant", "t")])
def test_keys_on_missing_database_never_create_it(tmp_path: Path, args: tuple[str, ...]) -> None:
    db = tmp_path / "nowhere.db"
    line = _one_error_line(_cli(_config(tmp_path, f"sqlite+aiosqlite:///{db}"), *args))
    assert str(db) in line and "does not exist" in line
    assert not db.exists()


def test_keys_on_unmigrated_and_unreachable_database(tmp_path: Path) -> None:
    sqlite3.connect(tmp_path / "empty.db").close()
    line = _one_error_line(
        _cli(_config(tmp_path, f"sqlite+aiosqlite:///{tmp_path / 'empty.db'}"), "keys", "list")
    )
    assert "api_key does not exist" in line and "servehall db upgrade" in line
    # a table from an older version (before auth_0003_key_priority): named, not a 500 later
    with sqlite3.connect(tmp_path / "old.db") as conn:
        conn.execute("CREATE TABLE api_key (key_id VARCHAR PRIMARY KEY, tenant VARCHAR)")
    line = _one_error_line(
        _cli(_config(tmp_path, f"sqlite+aiosqlite:///{tmp_path / 'old.db'}"), "keys", "list")
    )
    assert "api_key lacks column(s)" in line and "priority" in line
    assert "servehall db upgrade" in line
    pg = "postgresql+asyncpg://u:secret@127.0.0.1:1/nowhere"
    line = _one_error_line(_cli(_config(tmp_path, pg), "keys", "list"))
    assert "127.0.0.1:1/nowhere" in line and "secret" not in line


def test_keys_create_prints_no_none_and_names_the_database(tmp_path: Path) -> None:
    db = tmp_path / "keys.db"
    config = _config(tmp_path, f"sqlite+aiosqlite:///{db}")
    assert _cli(config, "db", "upgrade").returncode == 0
    made = _cli(config, "keys", "create", "--tenant", "team-a")
    assert made.returncode == 0, made.stderr
    assert "None" not in made.stderr, made.stderr
    assert "expires_at: never" in made.stderr and "models: * (every model)" in made.stderr
    assert f"database: sqlite+aiosqlite:///{db}" in made.stderr
    assert made.stdout.strip().startswith("sh-")
    data = json.loads(_cli(config, "keys", "create", "--tenant", "t", "--json").stdout)
    assert data["name"] is None  # JSON keeps null
    rows = sqlite3.connect(db).execute("SELECT pepper_fp FROM api_key").fetchall()
    assert rows == [(pepper_fingerprint(PEPPER),)] * 2
    assert "priority: the tenant's" in made.stderr


def test_keys_create_with_a_priority_of_its_own(tmp_path: Path) -> None:
    db = tmp_path / "keys.db"
    config = _config(tmp_path, f"sqlite+aiosqlite:///{db}")
    assert _cli(config, "db", "upgrade").returncode == 0
    made = _cli(
        config, "keys", "create", "--tenant", "t", "--priority", "-3", "--max-priority", "7"
    )
    assert made.returncode == 0, made.stderr
    assert "priority: -3" in made.stderr and "max_priority: 7" in made.stderr
    listed = json.loads(_cli(config, "keys", "list", "--json").stdout)
    assert [(k["priority"], k["max_priority"]) for k in listed] == [(-3, 7)]
    bad = _cli(config, "keys", "create", "--tenant", "t", "--priority", "1001")
    assert bad.returncode == 2 and "1001" in bad.stderr and "Traceback" not in bad.stderr


async def test_runtime_warns_when_no_key_matches_the_pepper(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from servehall_auth.runtime import AuthRuntime
    from servehall_auth.settings import AuthSettings

    url = f"sqlite+aiosqlite:///{tmp_path / 'keys.db'}"
    config = _config(tmp_path, url)
    assert _cli(config, "db", "upgrade").returncode == 0
    assert _cli(config, "keys", "create", "--tenant", "t").returncode == 0

    async def start(pepper: str) -> list[str]:
        caplog.clear()
        settings = AuthSettings(pepper=SecretStr(pepper))
        with caplog.at_level(logging.INFO, logger="servehall_auth"):
            rt = await AuthRuntime.start(settings, url, lambda event: None)
            await rt.close()
        return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]

    assert await start(PEPPER) == []
    assert any("1 made with the configured pepper" in m for m in caplog.messages)
    warnings = await start("a-different-pepper-0123456789")
    assert len(warnings) == 1
    assert "none of the 1 active API key(s) was made with the configured pepper" in warnings[0]
    assert PEPPER not in warnings[0] and "a-different-pepper" not in warnings[0]


async def test_pepper_report_counts(keystore: object) -> None:
    from servehall_auth.store import KeyStore

    assert isinstance(keystore, KeyStore)
    await keystore.create(tenant="a")
    revoked, _ = await keystore.create(tenant="a")
    await keystore.revoke(revoked.key_id)
    report = await keystore.pepper_report()
    assert (report.active, report.known, report.matching, report.mismatch) == (1, 1, 1, False)
    other = KeyStore(keystore.engine, "another-pepper-0123456789")
    assert (await other.pepper_report()).mismatch is True


@pytest.mark.parametrize("spelling", ["-c", "-cFILE", "--config=FILE"])
def test_plugin_commands_load_with_every_spelling_of_the_config_option(
    tmp_path: Path, spelling: str
) -> None:
    """``keys`` is the auth plugin's command: it exists only when the config that enables
    the plugin is found before the command line is parsed, whichever way it is named."""
    config = _config(tmp_path, f"sqlite+aiosqlite:///{tmp_path / 'x.db'}")
    option = (
        [spelling, str(config)] if spelling == "-c" else [spelling.replace("FILE", str(config))]
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("SERVEHALL_")}
    cmd = [sys.executable, "-c", "from servehall.cli import main; main()"]
    proc = subprocess.run(
        [*cmd, "keys", "list", *option, "--help"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "keys list" in proc.stdout
