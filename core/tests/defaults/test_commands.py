"""Tests of servehall.defaults.commands: the core's CLI commands registered by the
default plugin — ``plugins`` (JSON and tables), ``config check``/``show``, and the
``demo-model`` size check — in-process with Typer's runner on real config files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from servehall.defaults.commands import servehall_register_commands


@pytest.fixture
def cli() -> typer.Typer:
    app = typer.Typer()
    servehall_register_commands(app)
    return app


def _run(app: typer.Typer, *args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, list(args))
    return result.exit_code, result.stdout, result.stderr


def test_registered_commands(cli: typer.Typer) -> None:
    group = typer.main.get_command(cli)
    assert set(group.commands) == {  # type: ignore[attr-defined]
        "serve",
        "plugins",
        "config",
        "demo-model",
        "bench",
        "batch",
        "models",
    }
    config = group.commands["config"]  # type: ignore[attr-defined]
    assert set(config.commands) == {"check", "show", "apply", "history", "rollback"}


def test_plugins_json_lists_plugins_backends_and_their_enablement(
    cli: typer.Typer, tmp_path: Path
) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text("")
    code, out, _ = _run(cli, "plugins", "--json", "--config", str(cfg))
    assert code == 0
    data = json.loads(out)
    assert set(data) == {"plugins", "backends", "demo_enables"}
    backends = {b["name"]: b for b in data["backends"]}
    assert backends["null"]["enabled"] and backends["null"]["available"]
    assert backends["cpu"]["enabled"]
    # a backend of an installed plugin that is not enabled is probed, marked not enabled
    default_plugins = {p["name"] for p in data["plugins"] if p["default"]}
    assert {"servehall.cpu_backend", "servehall.null_backend"} <= default_plugins
    for b in data["backends"]:
        assert b["enabled"] is (b["plugin"] in default_plugins), b


def test_plugins_tables(cli: typer.Typer, tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text("")
    code, out, _ = _run(cli, "plugins", "--config", str(cfg))
    assert code == 0 and "plugins" in out and "backends" in out and "null" in out


def test_config_check_ok_and_errors(cli: typer.Typer, tmp_path: Path) -> None:
    good = tmp_path / "good.toml"
    good.write_text('[scheduler]\npolicy = "fair"\n')
    code, out, _ = _run(cli, "config", "check", str(good))
    assert (code, out) == (0, f"{good}: OK\n")
    bad = tmp_path / "bad.toml"
    bad.write_text('[scheduler]\npolicy = "lottery"\n[[sinks]]\nname = "kafka"\n')
    code, _, err = _run(cli, "config", "check", str(bad))
    lines = err.strip().splitlines()
    assert code == 1 and lines[-1] == f"{bad}: 2 error(s)"
    assert lines[0].startswith(f"{bad}: scheduler.policy: unknown policy 'lottery'")
    assert lines[1].startswith(f"{bad}: sinks[0].name: unknown sink 'kafka'")


def test_config_show_masks_secrets(cli: typer.Typer, tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text('[database]\nurl = "postgresql+asyncpg://app:s3cret@db:5432/sh"\n')
    code, out, _ = _run(cli, "config", "show", "--config", str(cfg))
    assert code == 0 and "s3cret" not in out
    shown = json.loads(out)
    assert "db:5432/sh" in json.dumps(shown["database"])
    assert shown["scheduler"]["policy"] == "fcfs"


def test_demo_model_refuses_an_unknown_size(cli: typer.Typer, tmp_path: Path) -> None:
    code, _, err = _run(cli, "demo-model", "--size", "huge", "--out", str(tmp_path / "x"))
    assert code == 2 and "unknown --size 'huge'; known: demo, small" in err
    assert not (tmp_path / "x").exists()
