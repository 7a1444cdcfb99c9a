"""What every ``servehall bench`` command shares: its options (the Typer annotations of
the workload flags), their check (:func:`workload_spec`: one line and exit status 2 for a
bad value), the way a command runs and ends (:func:`run_cli`, :func:`checked`: expected
failures become one line on stderr and exit status 1 or 2), the logging it sets
(:func:`bench_logging`) and the summary of one run (:func:`finish_run`).

The commands themselves are in :mod:`servehall.bench.cli`.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

import typer
from rich.console import Console

from servehall.bench.client import Endpoint, TargetError
from servehall.bench.workload import DATASETS, WorkloadError, WorkloadSpec

T = TypeVar("T")


class UsageError(Exception):
    """A bad option value (exit status 2)."""


# --- options shared by the three commands -----------------------------------------------

NumRequests = Annotated[int, typer.Option("--num-requests", "-n", help="Requests to send.")]
Concurrency = Annotated[
    int | None,
    typer.Option("--concurrency", help="Most requests in flight (default: no cap)."),
]
RequestRate = Annotated[
    float | None,
    typer.Option(
        "--request-rate",
        help="Requests per second, Poisson arrivals (default: all at once, i.e. inf).",
    ),
]
Burstiness = Annotated[
    float, typer.Option("--burstiness", help="Gamma shape of arrival gaps (1 = Poisson).")
]
Dataset = Annotated[str, typer.Option("--dataset", help=f"One of {', '.join(DATASETS)}.")]
DatasetPath = Annotated[
    Path | None, typer.Option("--dataset-path", help="ShareGPT JSON file (--dataset sharegpt).")
]
InputLen = Annotated[int, typer.Option("--input-len", help="Prompt tokens (random dataset).")]
OutputLen = Annotated[
    int | None,
    typer.Option(
        "--output-len",
        help="max_tokens per request (random default 128; "
        "sharegpt default: the recorded reply's length).",
    ),
]
RangeRatio = Annotated[
    float, typer.Option("--range-ratio", help="Random lengths vary by ± this fraction.")
]
Seed = Annotated[int, typer.Option("--seed", help="Seed of prompts and arrivals.")]
EndpointOpt = Annotated[
    str, typer.Option("--endpoint", help="chat (/v1/chat/completions) or completions.")
]
IgnoreEos = Annotated[
    bool,
    typer.Option(
        "--ignore-eos/--no-ignore-eos", help="Ask for exactly max_tokens tokens (ignore_eos)."
    ),
]
ResponseFormat = Annotated[
    str,
    typer.Option(
        "--response-format",
        help="none (free text) or json (a mid-size JSON schema, structured output); "
        "compare targets may override it with ,rf=none|json.",
    ),
]
Slo = Annotated[
    str | None,
    typer.Option("--slo", help="Goodput SLOs in ms, e.g. ttft=500,tpot=50 (ttft|tpot|e2el)."),
]
OutputJson = Annotated[Path | None, typer.Option("--output-json", help="Write results as JSON.")]
PlotOpt = Annotated[
    Path | None, typer.Option("--plot", help="Write latency CDFs + throughput (PNG).")
]
ConfigOpt = Annotated[
    Path | None, typer.Option("--config", "-c", help="Deployment config (TOML/YAML).")
]
Quiet = Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar.")]


_WORKLOAD_OPTIONS = (
    "num_requests",
    "concurrency",
    "request_rate",
    "burstiness",
    "dataset",
    "dataset_path",
    "input_len",
    "output_len",
    "range_ratio",
    "seed",
    "endpoint",
    "ignore_eos",
    "slo",
    "response_format",
)
"""The parameters of :func:`workload_spec`: shared by ``bench serve|engine|compare``."""


def workload_from(options: dict[str, Any]) -> WorkloadSpec:
    """:func:`workload_spec` of the workload options among a command's parameters (the
    same names in every bench command)."""
    return workload_spec(**{name: options[name] for name in _WORKLOAD_OPTIONS})


def workload_spec(
    num_requests: int,
    concurrency: int | None,
    request_rate: float | None,
    burstiness: float,
    dataset: str,
    dataset_path: Path | None,
    input_len: int,
    output_len: int | None,
    range_ratio: float,
    seed: int,
    endpoint: str,
    ignore_eos: bool,
    slo: str | None,
    response_format: str = "none",
) -> WorkloadSpec:
    """Check the workload options (raises UsageError with one line)."""
    from servehall.bench.metrics import parse_slo

    if num_requests < 1:
        raise UsageError(f"--num-requests must be at least 1 (got {num_requests})")
    if concurrency is not None and concurrency < 1:
        raise UsageError(f"--concurrency must be at least 1 (got {concurrency})")
    rate = math.inf if request_rate is None else request_rate
    if not rate > 0:
        raise UsageError(f"--request-rate must be positive (got {request_rate})")
    if not burstiness > 0:
        raise UsageError(f"--burstiness must be positive (got {burstiness})")
    if dataset not in DATASETS:
        raise UsageError(f"unknown dataset {dataset!r}; known: {', '.join(DATASETS)}")
    if dataset == "sharegpt" and dataset_path is None:
        raise UsageError("--dataset sharegpt needs --dataset-path FILE")
    if endpoint not in ("chat", "completions"):
        raise UsageError(f"--endpoint must be chat or completions (got {endpoint!r})")
    if input_len < 1:
        raise UsageError(f"--input-len must be at least 1 (got {input_len})")
    if output_len is not None and output_len < 1:
        raise UsageError(f"--output-len must be at least 1 (got {output_len})")
    if not 0 <= range_ratio < 1:
        raise UsageError(f"--range-ratio must be in [0, 1) (got {range_ratio})")
    try:
        slos = parse_slo(slo)
    except ValueError as exc:
        raise UsageError(f"--slo: {exc}") from None
    from servehall.bench.workload import RESPONSE_FORMATS

    if response_format not in RESPONSE_FORMATS:
        raise UsageError(f"--response-format must be none or json (got {response_format!r})")
    ep: Endpoint = "chat" if endpoint == "chat" else "completions"
    return WorkloadSpec(
        num_requests,
        concurrency,
        rate,
        burstiness,
        dataset,
        dataset_path,
        input_len,
        output_len,
        range_ratio,
        seed,
        ep,
        ignore_eos,
        slos,
        response_format,
    )


def bench_logging() -> None:
    """Log warnings, and servehall's own INFO lines (a model's conversion progress), in
    the server's format.

    Set before any target runs: an in-process engine imports xgrammar, whose import
    calls ``logging.basicConfig(level=INFO)`` when the root logger has no handler yet —
    which put a line for every HTTP request of the load generator (httpx logs each at
    INFO) into the report.
    """
    from servehall.server.logs import configure_logging

    configure_logging("warning")
    logging.getLogger("servehall").setLevel(logging.INFO)


def run_cli(main: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run ``main()`` on a fresh event loop (logging set by :func:`bench_logging`);
    expected failures become one line + exit."""
    from servehall.bench.plot import PlotError
    from servehall.errors import ServehallError

    bench_logging()
    try:
        return asyncio.run(main())
    except UsageError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    except WorkloadError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    except (TargetError, PlotError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    except ServehallError as exc:
        typer.echo(
            f"error: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}", err=True
        )
        raise typer.Exit(1) from None


def checked(fn: Callable[[], T]) -> T:
    """Call ``fn``; UsageError → one line and exit status 2."""
    try:
        return fn()
    except UsageError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None


def load_tokenizer_or_fail(path: Path | None) -> Any:
    """The tokenizer of model directory ``path`` (None → None); TargetError otherwise."""
    if path is None:
        return None
    from servehall.text.tokenizer import load_tokenizer

    try:
        return load_tokenizer(path)
    except Exception as exc:
        msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise TargetError(f"cannot load a tokenizer from {path}: {msg}") from None


Mode = Literal["serve", "engine"]


def finish_run(
    console: Console,
    title: str,
    spec: WorkloadSpec,
    target: dict[str, Any],
    result: Any,
    cpu_s: float | None,
    output_json: Path | None,
    plot: Path | None,
) -> None:
    """Summarise, print, write JSON and plot one run; exit 1 when nothing succeeded."""
    from servehall.bench.metrics import summarize
    from servehall.bench.report import print_summary, write_json

    summary = summarize(result.outputs, result.duration_s, spec.slo, cpu_s=cpu_s)
    print_summary(console, title, summary)
    if output_json is not None:
        data = {"target": target, "workload": spec.describe(), "summary": summary.as_dict()}
        write_json(output_json, data)
    if plot is not None:
        from servehall.bench.plot import plot_runs

        plot_runs(plot, [(title, result.outputs, result.duration_s)], title=title)
    if summary.completed == 0:
        first = next((o.error for o in result.outputs if o.error), "no request succeeded")
        raise TargetError(f"every request failed ({first})")
