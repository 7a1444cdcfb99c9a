"""Human and machine output of benchmark runs: rich tables, JSON, comparison ratios."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from servehall.bench.metrics import PERCENTILES, BenchSummary, Distribution

LATENCIES: tuple[tuple[str, str], ...] = (
    ("TTFT", "ttft_ms"),
    ("TPOT", "tpot_ms"),
    ("ITL", "itl_ms"),
    ("E2E latency", "e2el_ms"),
)


def make_console() -> Console:
    """A stdout console; 160 columns when stdout is not a terminal (files, pipes, CI logs),
    so the comparison table is never folded into unreadable slivers."""
    console = Console()
    return console if console.is_terminal else Console(width=160)


def summary_tables(title: str, s: BenchSummary) -> list[Table]:
    """The run table (counts, duration, throughput, goodput) and the latency table."""
    run = Table(title=escape(title), show_header=False, title_justify="left", min_width=60)
    run.add_column("metric")
    run.add_column("value", justify="right")
    run.add_row("successful requests", str(s.completed))
    run.add_row("failed requests", str(s.failed))
    for key, n in sorted(s.failures.items()):
        run.add_row(f"  {key}", str(n))
    run.add_row("duration (s)", f"{s.duration_s:.2f}")
    run.add_row("total input tokens", str(s.total_input_tokens))
    run.add_row("total output tokens", str(s.total_output_tokens))
    run.add_row("request throughput (req/s)", f"{s.request_throughput:.2f}")
    run.add_row("output token throughput (tok/s)", f"{s.output_throughput:.1f}")
    run.add_row("total token throughput (tok/s)", f"{s.total_token_throughput:.1f}")
    if s.goodput is not None:
        slo = ", ".join(f"{k}≤{v:g} ms" for k, v in s.slo.items())
        run.add_row(escape(f"goodput (req/s) [{slo}]"), f"{s.goodput:.2f}")
        run.add_row("requests within SLO", f"{s.good_completed}/{s.completed}")
    if s.cpu_s is not None:
        run.add_row("CPU (s)", f"{s.cpu_s:.2f}")
    for key, value in s.extra.items():
        run.add_row(escape(key), escape(str(value)))
    lat = Table(title="latency (ms)", title_justify="left", min_width=60)
    lat.add_column("metric")
    for col in ("mean", *(f"P{p:g}" for p in PERCENTILES)):
        lat.add_column(col, justify="right")
    for label, attr in LATENCIES:
        d: Distribution = getattr(s, attr)
        lat.add_row(label, *(f"{v:.2f}" for v in (d.mean, *d.percentiles.values())))
    return [run, lat]


def print_summary(console: Console, title: str, s: BenchSummary) -> None:
    """Print :func:`summary_tables`."""
    for table in summary_tables(title, s):
        console.print(table)


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Write ``data`` as indented JSON (parent directories are created)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, default=str) + "\n")


def ratio(a: float | None, b: float | None) -> float | None:
    """``a / b``, None when either is missing or ``b`` is 0."""
    if a is None or b is None or b == 0:
        return None
    return a / b


def comparison_table(rows: Sequence[dict[str, Any]], baseline: str) -> Table:
    """One row per target: throughput, TTFT/TPOT/ITL P50, CPU per token, and ratios to
    ``baseline`` (the first target). ``rows`` are :func:`servehall.bench.compare` rows."""
    t = Table(title=escape(f"comparison (ratios against {baseline})"), title_justify="left")
    for col in (
        "target",
        "ok/sent",
        "out tok/s",
        "× tok/s",
        "TTFT P50 ms",
        "TPOT P50 ms",
        "ITL P50 ms",
        "× ITL P50",
        "E2E P50 ms",
        "CPU s",
        "CPU µs/tok",
        "frontend µs/tok",
        "client µs/tok",
        "API µs/tok",
        "HTTP procs µs/tok",
        "worker µs/tok",
        "× engine CPU",
    ):
        t.add_column(col, justify="right" if col != "target" else "left", overflow="fold")

    def f(v: float | None, fmt: str) -> str:
        return "-" if v is None else format(v, fmt)

    for r in rows:
        t.add_row(
            escape(r["target"]),
            f"{r['completed']}/{r['sent']}",
            f(r["output_throughput"], ".1f"),
            f(r["throughput_ratio"], ".3f"),
            f(r["ttft_p50_ms"], ".2f"),
            f(r["tpot_p50_ms"], ".2f"),
            f(r["itl_p50_ms"], ".2f"),
            f(r["itl_p50_ratio"], ".3f"),
            f(r["e2el_p50_ms"], ".2f"),
            f(r["cpu_s"], ".2f"),
            f(r["cpu_us_per_token"], ".1f"),
            f(r["frontend_cpu_us_per_token"], ".1f"),
            f(r["client_cpu_us_per_token"], ".1f"),
            f(r.get("api_cpu_us_per_token"), ".1f"),
            f(r.get("frontends_cpu_us_per_token"), ".1f"),
            f(r.get("worker_cpu_us_per_token"), ".1f"),
            f(r.get("worker_vs_engine"), ".2f"),
        )
    return t
