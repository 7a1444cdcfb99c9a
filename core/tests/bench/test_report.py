"""Tests of servehall.bench.report: the summary and comparison tables rendered to text,
ratios, the JSON report file."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

from rich.console import Console

from servehall.bench.metrics import RequestOutput, summarize
from servehall.bench.report import comparison_table, ratio, summary_tables, write_json


def _text(*renderables: Any) -> str:
    out = io.StringIO()
    console = Console(file=out, width=220)
    for r in renderables:
        console.print(r)
    return out.getvalue()


def _outputs() -> list[RequestOutput]:
    ok = RequestOutput(
        success=True,
        prompt_tokens=10,
        output_tokens=4,
        ttft=0.05,
        latency=0.2,
        itl=[0.05, 0.05, 0.05],
    )
    bad = RequestOutput(error="HTTP 503: engine unavailable", status=503)
    return [ok, ok, bad]


def test_ratio() -> None:
    assert ratio(3.0, 2.0) == 1.5
    assert ratio(None, 2.0) is None and ratio(1.0, None) is None and ratio(1.0, 0) is None


def test_summary_tables_show_counts_failures_and_goodput() -> None:
    s = summarize(_outputs(), 2.0, slo={"ttft": 100.0}, cpu_s=1.5)
    run, lat = summary_tables("run [demo]", s)
    text = _text(run, lat)
    assert "run [demo]" in text  # markup in the title is escaped, not eaten
    assert "successful requests" in text and "failed requests" in text
    assert "CPU (s)" in text and "1.50" in text
    assert "requests within SLO" in text and "2/2" in text
    assert "latency (ms)" in text and "TTFT" in text


def test_summary_without_slo_or_cpu() -> None:
    text = _text(*summary_tables("plain", summarize(_outputs()[:2], 1.0)))
    assert "goodput" not in text and "CPU (s)" not in text


def test_comparison_table_formats_missing_values_as_dashes() -> None:
    row: dict[str, Any] = {
        "target": "servehall",
        "completed": 9,
        "sent": 10,
        "output_throughput": 123.456,
        "throughput_ratio": 1.0,
        "ttft_p50_ms": 12.345,
        "tpot_p50_ms": None,
        "itl_p50_ms": 3.0,
        "itl_p50_ratio": None,
        "e2el_p50_ms": 100.0,
        "cpu_s": None,
        "cpu_us_per_token": None,
        "frontend_cpu_us_per_token": None,
        "client_cpu_us_per_token": None,
    }
    text = _text(comparison_table([row], "servehall"))
    assert "comparison (ratios against servehall)" in text
    line = next(ln for ln in text.splitlines() if "9/10" in ln)
    assert "123.5" in line and "12.35" in line and "1.000" in line and "-" in line


def test_write_json_creates_parents(tmp_path: Path) -> None:
    path = tmp_path / "a" / "b" / "report.json"
    write_json(path, {"x": 1, "p": Path("/tmp")})
    assert json.loads(path.read_text()) == {"x": 1, "p": "/tmp"}
    assert path.read_text().endswith("\n")
