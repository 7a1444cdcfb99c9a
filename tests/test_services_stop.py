"""Issue #13 §3.8: ``make test`` says that PostgreSQL stays up and how to stop it, and
``make services-stop`` stops it (on a private port and data directory here, so the
suite's own server is left alone)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_make_test_says_how_to_stop_postgresql() -> None:
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    out = subprocess.run(
        ["make", "-n", "test"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    assert "stays up after the tests" in out and "make services-stop" in out
    assert (
        "services-stop.sh"
        in subprocess.run(
            ["make", "-n", "services-stop"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout
    )


def _accepting(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_services_stop_stops_postgresql() -> None:
    if not list(Path("/usr/lib/postgresql").glob("*/bin/initdb")) and not shutil.which("initdb"):
        pytest.skip("PostgreSQL is not installed (.ci/services.sh installs it as root)")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # the server runs as the 'postgres' user when we are root: pytest's tmp_path (0700)
    # is out of its reach, a directory right under /tmp is not
    pg_dir = Path(tempfile.mkdtemp(prefix="servehall-pg-stop-"))
    os.chmod(pg_dir, 0o755)
    try:
        _start_and_stop(port, pg_dir)
    finally:
        env = {**os.environ, "SERVEHALL_PG_PORT": str(port), "SERVEHALL_PG_DIR": str(pg_dir)}
        subprocess.run(["bash", ".ci/services.d/postgres.sh", "stop"], cwd=ROOT, env=env)
        shutil.rmtree(pg_dir, ignore_errors=True)


def _start_and_stop(port: int, pg_dir: Path) -> None:
    env = {**os.environ, "SERVEHALL_PG_PORT": str(port), "SERVEHALL_PG_DIR": str(pg_dir)}
    start = subprocess.run(
        ["bash", ".ci/services.d/postgres.sh"], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert start.returncode == 0, start.stderr
    assert _accepting(port)
    stop = subprocess.run(
        [".ci/services-stop.sh"], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert stop.returncode == 0, stop.stderr
    assert f"stopped PostgreSQL on 127.0.0.1:{port}" in stop.stdout
    assert not _accepting(port)
    again = subprocess.run(
        [".ci/services-stop.sh"], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert again.returncode == 0 and "is not running" in again.stdout
