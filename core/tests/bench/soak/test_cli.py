"""``servehall bench soak`` (servehall.bench.soak.cli), in process through Typer's
runner: every option check (one ``error:`` line, exit status 2, nothing started), and the
exit status of real one-second soaks against a servehall API in the test process
(``live_server``): 0 without violations, 1 with one, 1 on a server that cannot be reached.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

sys.path.insert(0, str(Path(__file__).parent))
from live_server import serving

from servehall.cli import build_cli
from servehall.testing.sockets import free_port

pytestmark = pytest.mark.usefixtures("restore_logging")  # conftest.py: bench_logging


@pytest.fixture
def here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("SERVEHALL_CONFIG", raising=False)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    return tmp_path


def soak(*args: str) -> Result:
    argv = ["bench", "soak", *args]
    return CliRunner().invoke(build_cli(argv), argv)


def error_line(res: Result) -> str:
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), res.stderr
    assert "Traceback" not in res.output
    return lines[0]


@pytest.mark.parametrize(
    ("args", "expect"),
    [
        (["--duration", "-1"], "--duration must be positive (got -1)"),
        (["--clients", "0"], "--clients must be at least 1 (got 0)"),
        (["--max-tokens", "0"], "--max-tokens must be at least 1 (got 0)"),
        (["--faults", "worker-kill", "--faults", "disk-full"], "unknown fault 'disk-full'"),
        (["--url", "http://127.0.0.1:9", "--faults", "worker-kill"], "needs a server the soak"),
        (["--no-demo"], "give --url, --config or --demo"),
        (["--faults", "redis-restart"], "uses no Redis"),
        (["--faults", "db-restart"], "needs a PostgreSQL server"),
        (["--faults", "worker-stop", "--fault-stop", "0"], "--fault-stop must be in"),
        (["--url", "http://127.0.0.1:9", "--embed-path", "."], "--embed-path is for a server"),
        (["--embed-path", "no-such-dir"], "--embed-path no-such-dir is not a directory"),
        (["--api-processes", "0"], "--api-processes must be at least 1 (got 0)"),
        (["--url", "http://127.0.0.1:9", "--api-processes", "2"], "--api-processes is for"),
        (["--faults", "api-kill"], "api-kill needs frontend processes"),
    ],
)
def test_bad_options_are_one_line_and_start_nothing(
    here: Path, args: list[str], expect: str
) -> None:
    res = soak(*args)
    assert res.exit_code == 2, res.output
    assert expect in error_line(res)
    assert list(here.iterdir()) == []  # no server, no work directory, no database


def test_the_options_reach_the_soak(here: Path) -> None:
    with serving(here / "srv", tokens_per_s=4000) as url:
        out = here / "soak.json"
        res = soak(
            "--url", url, "--model", "m", "--duration", "1", "--clients", "3",
            "--schemas", "2", "--max-tokens", "3", "--pid", str(os.getpid()),
            "--rss-bound-mib", "4096", "--output-json", str(out), "--workdir", str(here / "w"),
        )  # fmt: skip
    assert res.exit_code == 0, res.output
    assert f"soak {url}: 3 clients, 1 s; shapes: valid" in res.stdout
    report = json.loads(out.read_text())
    assert report["clients"] == 3 and report["requests"] >= 3  # one per client at least
    assert report["invariants"]["I1"]["violation_count"] == 0
    assert "(bound 4096 MiB)" in " ".join(report["invariants"]["I6"]["notes"])


def test_a_violation_is_exit_status_1(here: Path) -> None:
    with serving(here / "srv", test_fail_every=1) as url:
        res = soak("--url", url, "--model", "m", "--duration", "0.5", "--schemas", "2")
    assert res.exit_code == 1, res.output
    assert "I1 FAIL" in res.stdout


def test_an_unreachable_server_is_a_violation_not_a_traceback(here: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    res = soak("--url", url, "--duration", "0.3", "--clients", "1", "--schemas", "1")
    assert res.exit_code == 1, res.output
    assert "I1 FAIL" in res.stdout and "no answer" in res.stdout
    assert res.exception is None or isinstance(res.exception, SystemExit)
