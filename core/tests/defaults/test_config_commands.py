"""Tests of servehall.defaults.config_commands (``servehall config apply|history|
rollback``) in-process with Typer's runner on a real SQLite database: revisions stored,
an unchanged file not stored twice, settings that cannot change live refused, history
lines, rollback to the previous revision, and the deployment without revisions."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from servehall.defaults import commands, records_commands


@pytest.fixture
def app() -> typer.Typer:
    cli = typer.Typer()
    commands.servehall_register_commands(cli)
    records_commands.servehall_register_commands(cli)
    return cli


def _run(app: typer.Typer, *args: str) -> tuple[int, str, str]:
    res = CliRunner().invoke(app, list(args))
    return res.exit_code, res.stdout, res.stderr


def _write(here: Path, name: str, weight: int = 1, revisions: bool = True, extra: str = "") -> Path:
    path = here / name
    path.write_text(
        f"sinks = []\n{extra}\n[server]\nconfig_revisions = {str(revisions).lower()}\n\n"
        f'[database]\nurl = "sqlite+aiosqlite:///{here / "r.db"}"\n\n'
        f'[[models]]\nname = "m"\npath = "{here}"\nbackend = "null"\nweight = {weight}\n'
    )
    return path


@pytest.fixture
def deployed(app: typer.Typer, here: Path) -> Path:
    cfg = _write(here, "deploy.toml")
    assert _run(app, "db", "upgrade", "--config", str(cfg))[0] == 0
    return cfg


def test_apply_stores_a_revision_once(app: typer.Typer, here: Path, deployed: Path) -> None:
    code, out, _ = _run(app, "config", "apply", str(deployed), "--config", str(deployed))
    assert code == 0 and out.startswith("revision 1 (") and "replicas apply it live" in out
    code, out2, _ = _run(app, "config", "apply", str(deployed), "--config", str(deployed))
    assert code == 0 and out2 == out  # the same text: no new revision
    new = _write(here, "new.toml", weight=3)
    code, out, _ = _run(app, "config", "apply", str(new), "--config", str(deployed))
    assert code == 0 and out.startswith("revision 2 (")


def test_apply_refuses_changes_that_need_a_restart(
    app: typer.Typer, here: Path, deployed: Path
) -> None:
    assert _run(app, "config", "apply", str(deployed), "--config", str(deployed))[0] == 0
    restart = _write(here, "restart.toml", extra='[scheduler]\npolicy = "fair"\n')
    code, _, err = _run(app, "config", "apply", str(restart), "--config", str(deployed))
    assert code == 1
    assert f"{restart}: scheduler: cannot change without a restart" in err
    assert err.strip().endswith("error(s); nothing applied")


def test_apply_refuses_an_invalid_file(app: typer.Typer, here: Path, deployed: Path) -> None:
    bad = here / "bad.toml"
    bad.write_text('[scheduler]\npolicy = "lottery"\n')
    code, _, err = _run(app, "config", "apply", str(bad), "--config", str(deployed))
    assert code == 1 and "scheduler.policy" in err and "1 error(s); nothing applied" in err


def test_history_and_rollback(app: typer.Typer, here: Path, deployed: Path) -> None:
    code, _, err = _run(app, "config", "history", "--config", str(deployed))
    assert code == 0 and "no config revisions recorded" in err
    code, _, err = _run(app, "config", "rollback", "--config", str(deployed))
    assert code != 0 and "nothing to roll back to" in err
    _run(app, "config", "apply", str(deployed), "--config", str(deployed))
    _run(app, "config", "apply", str(_write(here, "w3.toml", weight=3)), "--config", str(deployed))
    code, out, _ = _run(app, "config", "history", "--json", "--diff", "--config", str(deployed))
    rows = [json.loads(line) for line in out.splitlines()]
    assert [r["revision"] for r in rows] == [2, 1]
    assert rows[0]["added_lines"] == 1 and rows[0]["removed_lines"] == 1
    assert "+weight = 3" in rows[0]["diff"] and rows[0]["applied_by"].startswith("cli:")
    code, out, _ = _run(app, "config", "rollback", "--config", str(deployed))
    assert code == 0 and out.startswith("revision 3 = revision 1 (")
    code, out, _ = _run(app, "config", "history", "-n", "1", "--config", str(deployed))
    assert out.split()[0] == "3" and len(out.strip().splitlines()) == 1
    code, _, err = _run(app, "config", "rollback", "7", "--config", str(deployed))
    assert code != 0 and "no config revision 7 (newest: 3)" in err


def test_a_deployment_without_revisions_refuses(app: typer.Typer, here: Path) -> None:
    """The ConfigError reaches ``servehall``'s main, which prints it as one line."""
    from servehall.errors import ConfigError

    cfg = _write(here, "off.toml", revisions=False)
    assert _run(app, "db", "upgrade", "--config", str(cfg))[0] == 0
    for args in (["apply", str(cfg)], ["rollback"]):
        res = CliRunner().invoke(app, ["config", *args, "--config", str(cfg)])
        assert isinstance(res.exception, ConfigError), res.output
        assert "[server] config_revisions is off" in str(res.exception)
