"""``servehall bench`` end to end: the real CLI against real ``servehall serve``
subprocesses (demo model on OpenVINO, and the ``null`` backend), and in-process engines.

Tiny N everywhere: the tests check counts, shapes and exit statuses, never speed.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from servehall.testing.cli import servehall_cmd
from tests.conftest import ServerHandle, demo_config, dump_toml, free_port, run_cli

CLI = servehall_cmd()


def bench(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """Run ``servehall bench ARGS`` as a subprocess (text output, no exit check)."""
    return subprocess.run([*CLI, "bench", *args], capture_output=True, text=True, timeout=timeout)


def null_config(model_dir: Path, **options: Any) -> dict[str, Any]:
    return {
        "models": [{"name": "null", "path": str(model_dir), "backend": "null", "options": options}],
        "sinks": [],
    }


@pytest.fixture(scope="module")
def demo_server(servehall_server: Any, demo_model_dir: Path) -> Iterator[ServerHandle]:
    with servehall_server(demo_config(demo_model_dir), name="bench-demo") as srv:
        yield srv


@pytest.fixture(scope="module")
def null_server(servehall_server: Any, demo_model_dir: Path) -> Iterator[ServerHandle]:
    cfg = null_config(demo_model_dir, tokens_per_s=2000)
    with servehall_server(cfg, name="bench-null") as srv:
        yield srv


def _json(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text())
    return data


@pytest.mark.parametrize("proto", ["--http2", "--http1"])
def test_bench_serve_demo_model(
    demo_server: ServerHandle, demo_model_dir: Path, tmp_path: Path, proto: str
) -> None:
    out = tmp_path / "serve.json"
    plot = tmp_path / "serve.png"
    r = bench(
        "serve", "--base-url", demo_server.base_url, "--model", "demo", proto,
        "--tokenizer", str(demo_model_dir), "-n", "6", "--concurrency", "3",
        "--input-len", "16", "--output-len", "8", "--slo", "ttft=600000,tpot=600000",
        "--output-json", str(out), "--plot", str(plot), "--quiet",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "TTFT" in r.stdout and "goodput" in r.stdout
    data = _json(out)
    s = data["summary"]
    assert (s["completed"], s["failed"]) == (6, 0)
    assert s["total_output_tokens"] == 6 * 8  # ignore_eos: exactly max_tokens each
    assert s["good_completed"] == 6
    assert s["goodput"] == pytest.approx(s["request_throughput"])
    assert s["tpot_ms"]["count"] == 6 and s["itl_ms"]["count"] > 0
    assert 0 < s["ttft_ms"]["median"] <= s["e2el_ms"]["median"]
    assert data["target"]["protocol"] == ("h2" if proto == "--http2" else "http/1.1")
    assert data["workload"]["num_requests"] == 6
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bench_serve_request_rate_and_sharegpt(null_server: ServerHandle, tmp_path: Path) -> None:
    sg = tmp_path / "sharegpt.json"
    conv = [{"from": "human", "value": "tell me about the sea"}, {"from": "gpt", "value": "x"}]
    sg.write_text(json.dumps([{"conversations": conv}]))
    out = tmp_path / "rate.json"
    r = bench(
        "serve", "--base-url", null_server.base_url + "/v1", "--model", "null",
        "--dataset", "sharegpt", "--dataset-path", str(sg), "--output-len", "5",
        "-n", "8", "--request-rate", "50", "--endpoint", "completions",
        "--output-json", str(out), "--quiet",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    s = _json(out)["summary"]
    assert (s["completed"], s["total_output_tokens"]) == (8, 40)
    assert _json(out)["workload"]["request_rate"] == 50


@pytest.mark.parametrize("native", [False, True])
def test_bench_engine_demo_model(demo_model_dir: Path, tmp_path: Path, native: bool) -> None:
    config = tmp_path / "deploy.toml"
    config.write_text(dump_toml(demo_config(demo_model_dir)))
    out = tmp_path / "engine.json"
    r = bench(
        "engine", "--config", str(config), "--model", "demo", "-n", "4",
        "--concurrency", "2", "--input-len", "16", "--output-len", "8",
        "--output-json", str(out), "--quiet", *(["--native"] if native else []),
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    data = _json(out)
    s = data["summary"]
    assert (s["completed"], s["failed"], s["total_output_tokens"]) == (4, 0, 32)
    assert s["cpu_s"] > 0
    api = "OpenVINO GenAI ContinuousBatchingPipeline" if native else "Engine protocol"
    assert data["target"] == {
        "kind": "engine", "model": "demo", "backend": "openvino_cpu", "api": api
    }  # fmt: skip


def test_bench_compare_null_engine_vs_launched_server(demo_model_dir: Path, tmp_path: Path) -> None:
    config = tmp_path / "null.toml"
    config.write_text(dump_toml(null_config(demo_model_dir, tokens_per_s=1000)))
    out = tmp_path / "compare.json"
    r = bench(
        "compare", "engine:null", "launch:h2", "launch:h1", "--config", str(config),
        "--model", "null", "-n", "6", "--concurrency", "3", "--input-len", "8",
        "--output-len", "10", "--output-json", str(out), "--quiet",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "comparison" in r.stdout
    rows = _json(out)["rows"]
    assert [row["target"] for row in rows] == ["engine:null", "launch:h2", "launch:h1"]
    assert all(row["completed"] == 6 for row in rows)
    assert rows[0]["throughput_ratio"] == pytest.approx(1.0)
    assert rows[0]["frontend_cpu_us_per_token"] is None
    assert rows[0]["client_cpu_us_per_token"] is None  # no HTTP client in an engine run
    for row in rows[1:]:
        assert row["cpu_s"] > 0
        assert row["client_cpu_us_per_token"] > 0  # the load generator's own CPU
        assert row["frontend_cpu_us_per_token"] == pytest.approx(
            row["cpu_us_per_token"] - rows[0]["cpu_us_per_token"]
        )
        # the server's CPU split by process: the API process and its engine worker
        # (the null engine's worker may spend less than /proc's 10 ms tick in a run this
        # short: its share can read 0, never less, and the two add up to the total)
        # (the API process's too, on a run that /proc samples between ticks)
        assert row["api_cpu_us_per_token"] >= 0 and row["worker_cpu_us_per_token"] >= 0
        assert row["api_cpu_us_per_token"] + row["worker_cpu_us_per_token"] > 0
        assert row["api_cpu_us_per_token"] + row["worker_cpu_us_per_token"] == pytest.approx(
            row["cpu_us_per_token"]
        )
        assert row["worker_vs_engine"] == pytest.approx(
            row["worker_cpu_us_per_token"] / rows[0]["cpu_us_per_token"]
        )
    assert rows[0]["api_cpu_us_per_token"] is None
    assert [row["protocol"] for row in rows[1:]] == ["h2", "http/1.1"]


# --- bad arguments: one line on stderr, non-zero exit -----------------------------------


def _one_error_line(r: subprocess.CompletedProcess[str]) -> str:
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("error: "), r.stderr
    assert "Traceback" not in r.stderr
    return lines[0]


def test_unreachable_url_is_one_line() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    r = bench("serve", "--base-url", url, "--model", "m", "-n", "2", "--quiet")
    assert r.returncode == 1
    assert f"cannot reach {url}" in _one_error_line(r)


def test_unknown_model_is_one_line(null_server: ServerHandle) -> None:
    r = bench("serve", "--base-url", null_server.base_url, "--model", "nope", "-n", "2", "--quiet")
    assert r.returncode == 1
    assert "HTTP 404" in _one_error_line(r)


@pytest.mark.parametrize(
    ("args", "expect"),
    [
        (["-n", "0"], "--num-requests must be at least 1"),
        (["--dataset", "lmsys"], "unknown dataset 'lmsys'"),
        (["--dataset", "sharegpt"], "needs --dataset-path"),
        (["--slo", "ttft=fast"], "--slo"),
        (["--concurrency", "0"], "--concurrency must be at least 1"),
    ],
)
def test_bad_workload_arguments_are_one_line(args: list[str], expect: str) -> None:
    r = bench("serve", "--base-url", "http://127.0.0.1:9", "--model", "m", *args)
    assert r.returncode == 2
    assert expect in _one_error_line(r)


def test_sharegpt_file_missing_is_one_line(tmp_path: Path) -> None:
    r = bench(
        "serve", "--base-url", "http://127.0.0.1:9", "--model", "m", "--dataset", "sharegpt",
        "--dataset-path", str(tmp_path / "none.json"),
    )  # fmt: skip
    assert r.returncode == 2
    assert "does not exist" in _one_error_line(r)


def test_engine_unknown_model_is_one_line(demo_model_dir: Path, tmp_path: Path) -> None:
    config = tmp_path / "null.toml"
    config.write_text(dump_toml(null_config(demo_model_dir)))
    r = bench("engine", "--config", str(config), "--model", "other", "-n", "2", "--quiet")
    assert r.returncode == 1
    assert "model 'other' is not in the config's [[models]]" in _one_error_line(r)


def test_compare_bad_target_is_one_line() -> None:
    r = bench("compare", "engine", "--model", "m")
    assert r.returncode == 2
    assert "is not engine:MODEL" in _one_error_line(r)


@pytest.fixture(scope="module")
def auth_server(
    servehall_server: Any, demo_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerHandle]:
    work = tmp_path_factory.mktemp("bench-auth")
    cfg = null_config(demo_model_dir)
    cfg["plugins"] = {"enabled": ["auth"]}
    cfg["database"] = {"url": f"sqlite+aiosqlite:///{work / 'auth.db'}"}
    cfg["auth"] = {"pepper": {"env": "BENCH_TEST_PEPPER"}}
    env = {"BENCH_TEST_PEPPER": "pepper-for-the-bench-test-0123456789"}
    config = work / "auth.toml"
    config.write_text(dump_toml(cfg))
    migrated = run_cli(config, "db", "upgrade", env=env)
    assert migrated.returncode == 0, migrated.stderr
    with servehall_server(config.read_text(), name="bench-auth", env=env) as srv:
        yield srv


def test_refused_key_is_one_line(auth_server: ServerHandle) -> None:
    r = bench(
        "serve", "--base-url", auth_server.base_url, "--model", "null", "--api-key", "sk-wrong",
        "-n", "2", "--quiet",
    )  # fmt: skip
    assert r.returncode == 1
    assert "HTTP 401" in _one_error_line(r)


def test_ignore_eos_must_be_a_boolean(null_server: ServerHandle) -> None:
    import httpx

    body = {"model": "null", "prompt": "the sea", "max_tokens": 3, "ignore_eos": "yes"}
    with httpx.Client(http1=False, http2=True, timeout=30) as client:
        r = client.post(null_server.base_url + "/v1/completions", json=body)
        assert r.status_code == 400
        assert r.json()["error"]["param"] == "ignore_eos"
        ok = client.post(
            null_server.base_url + "/v1/completions", json={**body, "ignore_eos": True}
        )
        assert ok.status_code == 200
        assert ok.json()["usage"]["completion_tokens"] == 3
