"""``servehall.bench.options``: the option checks and failure handling every bench command
shares, and ``servehall bench`` logging: xgrammar's import-time ``basicConfig`` must not turn the
load generator's per-request httpx lines on (they filled compare reports)."""

from __future__ import annotations

import math
import subprocess
import sys
from typing import Any

import pytest
import typer

from servehall.bench.client import TargetError
from servehall.bench.options import UsageError, checked, run_cli, workload_from, workload_spec
from servehall.bench.workload import WorkloadError
from servehall.errors import NotFoundError

SCRIPT = """
import logging
from servehall.bench.options import bench_logging
{setup}
import xgrammar  # what an in-process engine imports: basicConfig(level=INFO)
logging.getLogger("httpx").info('HTTP Request: POST http://x/v1/chat/completions "200"')
logging.getLogger("servehall.engines.conversion").info("converting the model")
logging.getLogger("other").warning("a warning")
"""


def _stderr(setup: str) -> str:
    r = subprocess.run(
        [sys.executable, "-c", SCRIPT.format(setup=setup)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    return r.stderr


def test_bench_logging_keeps_warnings_and_servehall_info_only() -> None:
    err = _stderr("bench_logging()")
    assert "HTTP Request" not in err
    assert "INFO servehall.engines.conversion: converting the model" in err
    assert "WARNING other: a warning" in err


def test_without_it_xgrammar_turns_info_on() -> None:
    """The control: the same import without :func:`bench_logging` logs httpx's line."""
    assert "HTTP Request" in _stderr("")


# --- workload_spec: every bad workload option is one line (UsageError) ------------------

_GOOD: dict[str, Any] = {
    "num_requests": 10,
    "concurrency": None,
    "request_rate": None,
    "burstiness": 1.0,
    "dataset": "random",
    "dataset_path": None,
    "input_len": 32,
    "output_len": None,
    "range_ratio": 0.0,
    "seed": 0,
    "endpoint": "chat",
    "ignore_eos": False,
    "slo": None,
    "response_format": "none",
}


def test_good_options_make_a_spec_with_an_infinite_default_rate() -> None:
    spec = workload_from(dict(_GOOD, slo="ttft=500"))
    assert spec.num_requests == 10
    assert spec.request_rate == math.inf
    assert spec.endpoint == "chat"
    assert spec.slo


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"num_requests": 0}, "--num-requests must be at least 1 (got 0)"),
        ({"concurrency": 0}, "--concurrency must be at least 1"),
        ({"request_rate": 0.0}, "--request-rate must be positive"),
        ({"burstiness": 0.0}, "--burstiness must be positive"),
        ({"dataset": "nope"}, "unknown dataset 'nope'"),
        ({"dataset": "sharegpt"}, "--dataset sharegpt needs --dataset-path FILE"),
        ({"endpoint": "embeddings"}, "--endpoint must be chat or completions"),
        ({"input_len": 0}, "--input-len must be at least 1"),
        ({"output_len": 0}, "--output-len must be at least 1"),
        ({"range_ratio": 1.0}, "--range-ratio must be in [0, 1)"),
        ({"slo": "ttft"}, "--slo: "),
        ({"response_format": "xml"}, "--response-format must be none or json"),
    ],
)
def test_a_bad_option_is_one_usage_error(change: dict[str, Any], message: str) -> None:
    with pytest.raises(UsageError) as err:
        workload_spec(**dict(_GOOD, **change))
    assert message in str(err.value)
    assert "\n" not in str(err.value)


def test_checked_turns_a_usage_error_into_exit_2() -> None:
    def bad() -> None:
        raise UsageError("no")

    with pytest.raises(typer.Exit) as exit_:
        checked(bad)
    assert exit_.value.exit_code == 2
    assert checked(lambda: 5) == 5


@pytest.mark.parametrize(
    ("exc", "code"),
    [
        (UsageError("bad flag"), 2),
        (WorkloadError("bad workload"), 2),
        (TargetError("unreachable"), 1),
        (NotFoundError("no such model\nsecond line"), 1),
    ],
)
def test_run_cli_ends_expected_failures_with_one_line(
    exc: Exception, code: int, capsys: pytest.CaptureFixture[str]
) -> None:
    async def main() -> None:
        raise exc

    with pytest.raises(typer.Exit) as exit_:
        run_cli(main)
    assert exit_.value.exit_code == code
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1


def test_run_cli_returns_the_result() -> None:
    async def main() -> int:
        return 7

    assert run_cli(main) == 7
