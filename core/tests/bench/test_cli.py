"""``servehall bench serve | engine | compare | soak`` (servehall.bench.cli), in process
through Typer's runner: the commands registered, the checks made before anything runs
(one ``error:`` line, exit status 2), the failures of a run (exit status 1), and real
``bench engine`` / ``bench compare`` runs on the ``null`` engine over a locally built
tokenizer (a few requests, well under a second each). The subprocess runs against real
servers are in tests/test_bench_e2e.py."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner, Result

sys.path.insert(0, str(Path(__file__).parents[1]))
from text_fixtures import build_tokenizer

from servehall.bench.cli import bench_app
from servehall.testing.sockets import free_port

pytestmark = pytest.mark.usefixtures("restore_logging")  # conftest.py: bench_logging


@pytest.fixture(scope="module")
def null_config(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A config serving model ``n`` on the null engine (tokenizer built here)."""
    work = tmp_path_factory.mktemp("bench-cli")
    model = build_tokenizer(work / "model")
    facts = {"vocab_size": 400, "max_position_embeddings": 512, "eos_token_id": 1}
    (model / "config.json").write_text(json.dumps(facts))
    config = work / "null.toml"
    config.write_text(
        f'sinks = []\n[[models]]\nname = "n"\npath = "{model}"\nbackend = "null"\n'
        "[models.options]\ntokens_per_s = 4000\n"
    )
    return config


def bench(*args: str) -> Result:
    return CliRunner().invoke(bench_app, list(args))


def error_line(res: Result) -> str:
    """The one ``error:`` line on stderr (and no traceback)."""
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), res.stderr
    assert res.exception is None or isinstance(res.exception, SystemExit), res.exception
    return lines[0]


def test_the_four_commands_are_registered() -> None:
    res = bench("--help")
    assert res.exit_code == 0
    for name in ("serve", "engine", "compare", "soak"):
        assert name in res.stdout
    assert bench().exit_code == 2  # no_args_is_help: usage, not a run


def test_serve_refuses_a_base_url_without_a_scheme() -> None:
    res = bench("serve", "--base-url", "127.0.0.1:8000", "--model", "m", "-n", "1")
    assert res.exit_code == 2
    assert "--base-url must start with http:// or https://" in error_line(res)


def test_serve_checks_the_workload_before_the_url() -> None:
    res = bench("serve", "--base-url", "nope", "--model", "m", "--range-ratio", "1")
    assert res.exit_code == 2
    assert "--range-ratio must be in [0, 1)" in error_line(res)


def test_serve_fails_in_one_line_on_an_unreachable_server() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    res = bench("serve", "--base-url", url, "--model", "m", "-n", "2", "--quiet")
    assert res.exit_code == 1
    assert f"error: cannot reach {url}" in error_line(res)


def test_serve_fails_in_one_line_on_a_directory_without_a_tokenizer(
    null_config: Path, tmp_path: Path
) -> None:
    # (null_config built a tokenizer: transformers is imported by then, not timed here)
    url = f"http://127.0.0.1:{free_port()}"
    res = bench("serve", "--base-url", url, "--model", "m", "--tokenizer", str(tmp_path))
    assert res.exit_code == 1
    assert f"cannot load a tokenizer from {tmp_path}" in error_line(res)


def test_engine_runs_the_workload_on_the_null_engine(null_config: Path, tmp_path: Path) -> None:
    out = tmp_path / "engine.json"
    res = bench(
        "engine", "--config", str(null_config), "--model", "n", "-n", "5",
        "--concurrency", "2", "--input-len", "12", "--output-len", "6", "--seed", "3",
        "--output-json", str(out), "--quiet",
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    data: dict[str, Any] = json.loads(out.read_text())
    assert data["target"] == {
        "kind": "engine", "model": "n", "backend": "null", "api": "Engine protocol"
    }  # fmt: skip
    s = data["summary"]
    assert (s["completed"], s["failed"], s["total_output_tokens"]) == (5, 0, 30)
    assert s["total_input_tokens"] > 0 and s["cpu_s"] > 0
    assert data["workload"]["num_requests"] == 5 and data["workload"]["seed"] == 3
    assert "bench engine n (null, Engine protocol)" in res.stdout


def test_engine_names_the_configured_models_for_an_unknown_one(null_config: Path) -> None:
    res = bench("engine", "--config", str(null_config), "--model", "other", "-n", "1")
    assert res.exit_code == 1
    assert "model 'other' is not in the config's [[models]] (configured: n)" in error_line(res)


@pytest.mark.parametrize(
    ("args", "expect"),
    [
        (["engine:n"], "engine:, launch: and vllm-server: targets need --config FILE"),
        (["launch:h2"], "need --config FILE"),
        (["engine"], "is not engine:MODEL"),
        (["launch:h2,api=0"], "'api=0' is not api=N with N in 1..64"),
        (["launch:h2", "--api-processes", "1,x"], "--api-processes: 'x' is not a number"),
        (["engine:n,api=2"], "api=N is for launch: and vllm-server: targets"),
    ],
)
def test_compare_checks_its_targets_first(args: list[str], expect: str) -> None:
    res = bench("compare", *args, "--model", "n", "-n", "1")
    assert res.exit_code == 2
    assert expect in error_line(res)


def test_compare_two_engine_runs_gives_ratios_against_the_first(
    null_config: Path, tmp_path: Path
) -> None:
    out = tmp_path / "compare.json"
    res = bench(
        "compare", "engine:n", "engine:n", "--config", str(null_config), "--model", "n",
        "-n", "4", "--input-len", "8", "--output-len", "5", "--output-json", str(out),
        "--quiet",
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    assert "comparison" in res.stdout
    data: dict[str, Any] = json.loads(out.read_text())
    rows = data["rows"]
    assert [r["target"] for r in rows] == ["engine:n", "engine:n #2"]
    assert all(r["completed"] == 4 for r in rows)
    assert rows[0]["throughput_ratio"] == pytest.approx(1.0)
    assert rows[1]["throughput_ratio"] > 0
    assert data["workload"]["num_requests"] == 4
    assert data["summaries"]["engine:n"]["completed"] == 4
    assert data["summaries"]["engine:n #2"]["completed"] == 4  # both runs kept


def test_soak_is_the_soak_command() -> None:
    res = bench("soak", "--duration", "0")
    assert res.exit_code == 2
    assert "--duration must be positive (got 0)" in error_line(res)
