"""``servehall keys list`` (the real CLI, a subprocess): ids are printed in full when
stdout is not a terminal, so an id copied from the table works with ``keys revoke``."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from servehall.testing.cli import run_cli

PEPPER_ENV = "SERVEHALL_TEST_AUTH_CLI_PEPPER"


def _cli(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {PEPPER_ENV: "cli-table-pepper-0123456789", "COLUMNS": "80"}
    proc = run_cli(config, *args, env=env, cwd=config.parent)
    assert proc.returncode == 0, f"servehall {' '.join(args)}: {proc.stdout}\n{proc.stderr}"
    return proc


def test_keys_list_prints_full_ids_when_not_a_tty(tmp_path: Path) -> None:
    config = tmp_path / "servehall.toml"
    config.write_text(
        "sinks = []\n"
        '[plugins]\nenabled = ["auth"]\n'
        f'[database]\nurl = "sqlite+aiosqlite:///{tmp_path / "servehall.db"}"\n'
        f'[auth]\npepper = {{ env = "{PEPPER_ENV}" }}\n'
    )
    _cli(config, "db", "upgrade")
    long_text = "x" * 40  # long tenant/name push the table far past 80 columns
    created = [
        json.loads(
            _cli(
                config,
                *("keys", "create", "--tenant", f"tenant-{i}-{long_text}"),
                *("--name", f"name-{i}-{long_text}", "--models", "demo,other-model"),
                *("--expires", "2031-01-31", "--json"),
            ).stdout
        )
        for i in range(2)
    ]
    out = _cli(config, "keys", "list").stdout
    assert "…" not in out, out
    for rec in created:
        assert rec["id"] in out.split(), out  # the whole id, as one word
        assert rec["tenant"] in out and rec["name"] in out, out
    # an id copied from the table is accepted by `keys revoke`
    revoked = json.loads(_cli(config, "keys", "revoke", created[0]["id"], "--json").stdout)
    assert revoked["status"] == "revoked"
