"""Config loading: TOML file, environment overrides, secrets, errors with key paths, CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from servehall.cli import build_cli
from servehall.config import load_settings, masked_dump
from servehall.errors import ConfigError

CONFIG = """
[server]
bind = ["127.0.0.1:9100"]

[[models]]
name = "demo"
path = "~/models/demo"
backend = "cpu"

[database]
url = { env = "TEST_DB_URL" }
"""


def test_toml_file_env_override_and_secret(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = tmp_path / "deploy.toml"
    cfg.write_text(CONFIG)
    monkeypatch.setenv("TEST_DB_URL", "postgresql+asyncpg://u:hunter2@db/x")
    monkeypatch.setenv("SERVEHALL_SCHEDULER__MAX_QUEUE", "7")
    monkeypatch.setenv("SERVEHALL_SERVER__BIND", '["127.0.0.1:9200"]')
    s = load_settings(cfg)
    assert s.server.bind == ["127.0.0.1:9200"]  # environment beats the file
    assert s.scheduler.max_queue == 7
    assert s.models[0].path == Path("~/models/demo").expanduser()
    assert s.database.url.get_secret_value().endswith("@db/x")
    dumped = json.dumps(masked_dump(s))
    assert "hunter2" not in dumped and "**********" in dumped


def test_config_env_var_names_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = tmp_path / "deploy.toml"
    cfg.write_text('[scheduler]\npolicy = "fcfs"\nmax_queue = 3\n')
    monkeypatch.setenv("SERVEHALL_CONFIG", str(cfg))
    assert load_settings().scheduler.max_queue == 3


def test_every_error_has_a_key_path(tmp_path: Path) -> None:
    cfg = tmp_path / "bad.toml"
    cfg.write_text(
        '[server]\nbind = ["nohostport"]\nmax_body_bytes = -1\n'
        '[[models]]\nname = ""\n[scheduler]\nmax_queue = "many"\n'
    )
    with pytest.raises(ConfigError) as err:
        load_settings(cfg)
    keys = {k for k, _ in err.value.errors}
    assert {"server.bind", "server.max_body_bytes", "models[0].name", "models[0].path"} <= keys
    assert "scheduler.max_queue" in keys


def test_secret_from_file_and_missing_env(tmp_path: Path) -> None:
    secret = tmp_path / "dburl"
    secret.write_text("sqlite+aiosqlite:///x.db\n")
    s = load_settings(data={"database": {"url": {"file": str(secret)}}})
    assert s.database.url.get_secret_value() == "sqlite+aiosqlite:///x.db"
    with pytest.raises(ConfigError) as err:
        load_settings(data={"database": {"url": {"env": "SURELY_UNSET_VAR_1234"}}})
    assert err.value.errors[0][0] == "database.url"


def test_invalid_toml_is_a_config_error(tmp_path: Path) -> None:
    cfg = tmp_path / "broken.toml"
    cfg.write_text("[server\n")
    with pytest.raises(ConfigError, match="invalid TOML"):
        load_settings(cfg)


def test_cli_config_check_and_show(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    runner = CliRunner()
    good = tmp_path / "good.toml"
    good.write_text(CONFIG)
    monkeypatch.setenv("TEST_DB_URL", "postgresql+asyncpg://u:hunter2@db/x")
    ok = runner.invoke(build_cli([]), ["config", "check", str(good)])
    assert ok.exit_code == 0, ok.output
    shown = runner.invoke(build_cli([]), ["config", "show", "--config", str(good)])
    assert shown.exit_code == 0 and "hunter2" not in shown.output
    assert json.loads(shown.output)["server"]["bind"] == ["127.0.0.1:9100"]

    bad = tmp_path / "bad.toml"
    bad.write_text('[server]\nbind = ["x"]\n[plugins]\nenabled = ["no_such_plugin"]\n')
    res = runner.invoke(build_cli([]), ["config", "check", str(bad)])
    assert res.exit_code == 1
    assert "server.bind" in res.output
    unknown = tmp_path / "unknown.toml"
    unknown.write_text('[plugins]\nenabled = ["no_such_plugin"]\n[mystery]\na = 1\n')
    res = runner.invoke(build_cli([]), ["config", "check", str(unknown)])
    assert res.exit_code == 1 and "no_such_plugin" in res.output


def test_unknown_section_is_reported(tmp_path: Path) -> None:
    cfg = tmp_path / "x.toml"
    cfg.write_text("[mystery]\na = 1\n")
    res = CliRunner().invoke(build_cli([]), ["config", "check", str(cfg)])
    assert res.exit_code == 1 and "mystery" in res.output


def test_cli_plugins_json_lists_defaults() -> None:
    res = CliRunner().invoke(build_cli([]), ["plugins", "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    names = {p["name"] for p in data["plugins"]}
    assert "servehall.schedulers" in names
    assert all("reason" in b for b in data["backends"])


def test_bad_env_override_is_one_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SERVEHALL_SERVER__BIND", "not json")
    with pytest.raises(ConfigError) as err:
        load_settings(data={})
    key, message = err.value.errors[0]
    assert key == "server" and "SERVEHALL_SERVER__BIND" in message and "JSON" in message
    res = CliRunner().invoke(build_cli([]), ["config", "show"])
    assert res.exit_code != 0 and "Traceback" not in res.output


def test_database_url_is_shown_without_its_password() -> None:
    s = load_settings(data={"database": {"url": "postgresql+asyncpg://u:hunter2@db:5432/x"}})
    assert masked_dump(s)["database"]["url"] == "postgresql+asyncpg://u:**********@db:5432/x"
    s = load_settings(data={})
    assert masked_dump(s)["database"]["url"] == "sqlite+aiosqlite:///servehall.db"


def test_unknown_policy_sink_and_backend_names(tmp_path: Path) -> None:
    cfg = tmp_path / "names.toml"
    cfg.write_text(
        '[scheduler]\npolicy = "wfq"\n[[sinks]]\nname = "kafka"\n'
        '[[models]]\nname = "m"\npath = "/tmp"\nbackend = "nosuchdev"\n'
    )
    res = CliRunner().invoke(build_cli([]), ["config", "check", str(cfg)])
    assert res.exit_code == 1
    for key in ("scheduler.policy", "sinks[0].name", "models[0].backend"):
        assert key in res.output
    assert "known: fair, fcfs, priority" in res.output


def test_plugins_lists_backends_of_plugins_not_enabled() -> None:
    res = CliRunner().invoke(build_cli([]), ["plugins", "--json"])
    backends = {b["name"]: b for b in json.loads(res.output)["backends"]}
    assert backends["cpu"]["enabled"] is True
    disabled = [b for b in backends.values() if not b["enabled"]]
    assert all(b["reason"] for b in disabled)
