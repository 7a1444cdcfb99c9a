"""Issue #13 §3: what a new operator trips on, through the real CLI (Typer's CliRunner).

* every database command gives one ``error:`` line and a non-zero exit for a missing,
  un-migrated or unreachable database — never a traceback;
* read-only commands never create a database, and say which database they used;
* ``db upgrade`` says what it applied;
* ``config check`` reports every error in one run;
* ``audit query`` prints floats rounded.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
from typer.testing import CliRunner

from servehall.cli import build_cli
from servehall.db.migrate import script_heads


def cli(*args: str) -> tuple[int, str, str]:
    res = CliRunner().invoke(build_cli(list(args)), list(args))
    return res.exit_code, res.stdout, res.stderr


def config(path: Path, url: str, extra: str = "") -> Path:
    cfg = path / "deploy.toml"
    cfg.write_text(f'sinks = []\n[database]\nurl = "{url}"\n{extra}')
    return cfg


READ_ONLY = [
    ("db", "status"),
    ("audit", "verify"),
    ("audit", "query", "requests_per_tenant_day"),
]


@pytest.mark.parametrize("args", READ_ONLY)
def test_read_only_commands_never_create_a_database(here: Path, args: tuple[str, ...]) -> None:
    code, out, err = cli(*args)
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("error: "), err
    assert f"{here / 'servehall.db'}" in err and "does not exist" in err
    assert "no --config" in err and "servehall db upgrade" in err
    assert not (here / "servehall.db").exists()
    assert "Traceback" not in out + err


@pytest.mark.parametrize("args", READ_ONLY)
def test_unmigrated_database_is_one_line(here: Path, args: tuple[str, ...]) -> None:
    sqlite3.connect(here / "empty.db").close()
    cfg = config(here, "sqlite+aiosqlite:///empty.db")
    code, out, err = cli(*args, "--config", str(cfg))
    assert "Traceback" not in out + err
    if args == ("db", "status"):
        assert code == 1 and "not migrated" in out and f"--config {cfg}" in out
        return
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("error: "), err
    assert "is not migrated" in err and f"servehall db upgrade --config {cfg}" in err
    assert str(here / "empty.db") in err


@pytest.mark.parametrize("args", [*READ_ONLY, ("db", "upgrade")])
def test_unreachable_database_is_one_line(here: Path, args: tuple[str, ...]) -> None:
    cfg = config(here, "postgresql+asyncpg://u:secret@127.0.0.1:1/nowhere")
    code, out, err = cli(*args, "--config", str(cfg))
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("error: cannot use the database "), err
    assert "127.0.0.1:1/nowhere" in err and "secret" not in err
    assert "Traceback" not in out + err


def test_db_upgrade_says_what_it_applied_then_commands_name_the_database(here: Path) -> None:
    cfg = config(here, "sqlite+aiosqlite:///fresh.db")
    code, out, err = cli("db", "upgrade", "--config", str(cfg))
    assert code == 0, err
    heads = sorted(script_heads())
    assert out.strip() == (
        f"migrated from an empty database to {', '.join(heads)}; the schema is up to date"
    )
    assert f"database: sqlite+aiosqlite:///{here / 'fresh.db'} (config {cfg})" in err
    code, out, _ = cli("db", "upgrade", "--config", str(cfg))
    assert code == 0 and out.startswith("nothing to apply: the schema is up to date")
    for args in READ_ONLY:
        code, out, err = cli(*args, "--config", str(cfg))
        assert code == 0, (args, err)
        assert f"database: sqlite+aiosqlite:///{here / 'fresh.db'} (config {cfg})" in err
    code, out, err = cli("audit", "query", "audit_events", "--format", "json", "--config", str(cfg))
    assert code == 0 and json.loads(out) == []  # stdout stays machine-readable


def test_audit_query_rounds_floats(here: Path) -> None:
    cfg = config(here, "sqlite+aiosqlite:///q.db")
    assert cli("db", "upgrade", "--config", str(cfg))[0] == 0
    db = sqlite3.connect(here / "q.db")
    for i, latency in enumerate((0.1 + 0.2, 1 / 3, 2 / 3)):
        db.execute(
            "INSERT INTO request_log (request_id, received_at, endpoint, status_code,"
            " prompt_tokens, completion_tokens, latency_s, ttft_s, stream, filter_verdicts,"
            " model, tenant) VALUES (?, '2026-11-30 10:00:00', '/v1/completions', ?, 1, 1,"
            " ?, ?, 0, '[]', 'demo', 't')",
            (f"r{i}", 200 if i < 2 else 500, latency, latency / 7),
        )
    db.commit()
    db.close()
    for name in ("latency_by_model", "error_rate_by_status"):
        for fmt in ("table", "csv", "json"):
            code, out, err = cli("audit", "query", name, "--format", fmt, "--config", str(cfg))
            assert code == 0, err
            floats = [t for t in out.replace(",", " ").replace('"', " ").split() if t[:1].isdigit()]
            assert floats, out
            assert all(len(t.split(".")[-1]) <= 6 for t in floats if "." in t), (name, fmt, out)


def test_config_check_reports_every_error_in_one_run(here: Path) -> None:
    cfg = here / "bad.toml"
    cfg.write_text(
        '[plugins]\nenabled = ["no_such_plugin", "auth"]\n'
        '[server]\nmax_n = "many"\nbind = ["x"]\n'
        '[scheduler]\npolicy = "wfq"\nmax_queue = -3\n'
        '[[sinks]]\nname = "kafka"\n'
        '[[models]]\nname = "m"\npath = "/tmp"\nbackend = "nosuchdev"\n'
        '[[models]]\nname = "m2"\npath = "/tmp"\nmax_model_len = "long"\n'
        "[auth]\nhide_forbidden_models = 3\n"
        "[mystery]\na = 1\n"
    )
    code, out, err = cli("config", "check", str(cfg))
    assert code == 1
    keys = {line.split(": ")[1] for line in err.splitlines() if line.startswith(f"{cfg}: ")}
    expected = {
        "server.max_n",  # type
        "server.bind",
        "scheduler.max_queue",
        "models[1].max_model_len",
        "plugins.enabled",  # unknown plugin
        "auth.hide_forbidden_models",  # a plugin section's type
        "mystery",  # unknown section
        "scheduler.policy",  # names, checked after the type errors
        "sinks[0].name",
        "models[0].backend",
    }
    assert expected <= keys, err
    assert "no_such_plugin" in err and "error(s)" in err.splitlines()[-1]
    assert "Traceback" not in out + err


@pytest.mark.parametrize("columns", ["80", "200"])
def test_plugins_keeps_names_whole_and_says_what_demo_enables(
    here: Path, monkeypatch: pytest.MonkeyPatch, columns: str
) -> None:
    monkeypatch.setenv("COLUMNS", columns)
    code, out, err = cli("plugins", "--json")
    assert code == 0, err
    data = json.loads(out)
    from servehall.plugin.manager import installed_entry_points

    expected_demo = ["openvino_cpu"] if "openvino_cpu" in installed_entry_points() else []
    assert data["demo_enables"] == expected_demo
    code, out, err = cli("plugins")
    assert code == 0, err
    assert max(len(line) for line in out.splitlines()) <= int(columns)
    words = set(out.replace("│", " ").replace(",", " ").split())
    for p in data["plugins"]:
        assert p["name"] in words, (p["name"], out)
        assert (p["distribution"] or "(core)") in words, (p["distribution"], out)
    for b in data["backends"]:
        assert b["name"] in words and (b["plugin"] or "") in words | {""}, (b, out)
    if expected_demo:
        assert "`servehall serve --demo` also enables openvino_cpu" in " ".join(out.split())


def test_demo_model_help_says_trained() -> None:
    res = CliRunner().invoke(build_cli([]), ["demo-model", "--help"])
    text = " ".join(res.stdout.split())
    assert res.exit_code == 0 and "random" not in text
    assert "trained" in text and "nonsense" in text


def test_a_plugin_command_without_its_config_says_where_plugin_commands_come_from(
    here: Path,
) -> None:
    """`servehall keys create` with the auth plugin installed but no --config: the
    unknown-command error explains that plugin commands load from the config's enabled
    plugins; the top-level help says so too."""
    res = CliRunner().invoke(build_cli(["keys", "create"]), ["keys", "create"])
    assert res.exit_code == 2
    out = " ".join(res.output.replace("│", " ").split())
    assert "No such command 'keys'" in out and "[plugins] enabled" in out and "--config" in out
    helped = CliRunner().invoke(build_cli([]), ["--help"])
    assert "[plugins] enabled" in " ".join(helped.output.replace("│", " ").split())
    cfg = here / "auth.toml"
    cfg.write_text('[plugins]\nenabled = ["auth"]\n[auth]\npepper = "x"\n')
    listed = CliRunner().invoke(
        build_cli(["keys", "--help", "--config", str(cfg)]), ["keys", "--help"]
    )
    assert listed.exit_code == 0, listed.output


def test_db_status_lists_quarantined_records(here: Path) -> None:
    cfg = here / "q.toml"
    cfg.write_text(
        '[database]\nurl = "sqlite+aiosqlite:///quar.db"\n'
        '[[sinks]]\nname = "sql"\noptions = { spill_path = "spill/s.jsonl" }\n'
    )
    assert cli("db", "upgrade", "--config", str(cfg))[0] == 0
    code, out, err = cli("db", "status", "--config", str(cfg))
    assert code == 0, err
    assert "quarantined records in record_rejected: none" in out
    assert "quarantine file" not in out
    db = sqlite3.connect(here / "quar.db")
    for i in range(2):
        db.execute(
            "INSERT INTO record_rejected (rejected_at, sink, kind, request_id, payload,"
            " payload_sha256, error) VALUES ('2026-12-04 10:00:00', 'sql', 'request', ?,"
            " '{}', ?, 'IntegrityError: x')",
            (f"r{i}", f"{i:064d}"),
        )
    db.commit()
    db.close()
    (here / "spill").mkdir()
    (here / "spill" / "servehall-rejected-sql.jsonl").write_text('{"a":1}\n{"a":2}\n{"a":3}\n')
    code, out, err = cli("db", "status", "--config", str(cfg))
    assert code == 0, err
    assert "quarantined records in record_rejected: 2 (sql: 2)" in out
    assert "quarantine file spill/servehall-rejected-sql.jsonl: 3 record(s)" in out
    assert out.rstrip().endswith("schema is up to date")
