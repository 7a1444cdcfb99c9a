"""Tests of the servehall.cli package: where the config is read from before the command
line is parsed, the core and plugin commands of the built app, the unknown-command hint,
and ``main``'s one-line errors."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from servehall.cli import PLUGIN_COMMANDS_HINT, _preparse_config, build_cli
from servehall.testing.cli import servehall_cmd


@pytest.mark.parametrize(
    ("argv", "want"),
    [
        (["serve", "--config", "a.toml"], "a.toml"),
        (["serve", "--config=b.toml"], "b.toml"),
        (["config", "check", "-c", "c.toml"], "c.toml"),
        (["config", "check", "-cd.toml"], "d.toml"),
        (["serve", "--config"], "env.toml"),  # no value: the environment's
        (["serve", "--cfg", "x"], "env.toml"),
    ],
)
def test_preparse_config(argv: list[str], want: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SERVEHALL_CONFIG", "env.toml")
    assert _preparse_config(argv) == want


def test_preparse_config_without_any(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SERVEHALL_CONFIG", raising=False)
    assert _preparse_config(["serve"]) is None


def _commands(argv: list[str]) -> set[str]:
    import typer

    group = typer.main.get_command(build_cli(argv))
    return set(group.commands)  # type: ignore[attr-defined]


def test_core_commands_are_there(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SERVEHALL_CONFIG", raising=False)
    assert {"serve", "config", "plugins", "models"} <= _commands([])


def test_enabled_plugins_add_their_commands(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SERVEHALL_CONFIG", raising=False)
    cfg = tmp_path / "c.toml"
    cfg.write_text('[plugins]\nenabled = ["auth"]\n')
    try:
        with_auth = _commands(["--config", str(cfg)])
    except Exception as exc:  # pragma: no cover - the auth plugin is part of this repo
        pytest.skip(f"auth plugin not installed: {exc}")
    assert "keys" in with_auth and "keys" not in _commands([])


def test_an_unreadable_config_still_builds_the_core_app(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SERVEHALL_CONFIG", raising=False)
    bad = tmp_path / "bad.toml"
    bad.write_text("this is [not toml")
    assert "serve" in _commands(["--config", str(bad)])


def test_unknown_command_says_where_plugin_commands_come_from(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("SERVEHALL_CONFIG", raising=False)
    result = CliRunner().invoke(build_cli([]), ["keys", "list"])
    assert result.exit_code == 2
    flat = " ".join(result.output.split()).replace("│", "").replace("  ", " ")
    assert "No such command 'keys'" in flat
    assert "[plugins] enabled" in flat


def test_main_prints_servehall_errors_as_one_line(tmp_path: Path) -> None:
    import subprocess

    bad = tmp_path / "bad.toml"
    bad.write_text("[scheduler]\npolicy = 3\n")
    out = subprocess.run(
        [*servehall_cmd(), "plugins", "--config", str(bad)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr == "error: config error: scheduler.policy: Input should be a valid string\n"


def test_hint_mentions_config() -> None:
    assert "--config" in PLUGIN_COMMANDS_HINT and "SERVEHALL_CONFIG" in PLUGIN_COMMANDS_HINT
