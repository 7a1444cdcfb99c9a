"""Tests of servehall.bench.plot: the CDF points and a real PNG written by matplotlib
(Agg) for one and for two runs, and the one-line error for a file that cannot be written."""

from __future__ import annotations

from pathlib import Path

import pytest

from servehall.bench.metrics import RequestOutput
from servehall.bench.plot import PlotError, _cdf, plot_runs

pytest.importorskip("matplotlib")

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _outputs(itl: float) -> list[RequestOutput]:
    outs = [RequestOutput(True, 4, 5, 0.05 * i, 0.02, 0.02 + 4 * itl, [itl] * 4) for i in range(6)]
    for o in outs:
        o.token_times = [o.start + o.ttft + k * itl for k in range(5)]
    return [*outs, RequestOutput(False, 4, 0, 0.0, error="boom")]


def test_cdf_in_ms_sorted_with_fractions() -> None:
    assert _cdf([0.003, 0.001, 0.002, 0.002]) == ([1.0, 2.0, 2.0, 3.0], [0.25, 0.5, 0.75, 1.0])
    assert _cdf([]) == ([], [])


def test_plot_writes_a_png_for_one_run(tmp_path: Path) -> None:
    one = plot_runs(tmp_path / "sub" / "one.png", [("a", _outputs(0.01), 0.5)], title="t")
    assert one == tmp_path / "sub" / "one.png" and one.read_bytes().startswith(PNG_MAGIC)


def test_plot_writes_a_png_for_several_runs(tmp_path: Path) -> None:
    runs = [("a", _outputs(0.01), 0.5), ("b", _outputs(0.02), 0.6), ("empty", [], 0.1)]
    two = plot_runs(tmp_path / "two.png", runs)
    assert two.read_bytes().startswith(PNG_MAGIC) and two.stat().st_size > 10_000


def test_an_unwritable_path_is_a_plot_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(PlotError, match=f"cannot write {blocker / 'p.png'}"):
        plot_runs(blocker / "p.png", [("a", _outputs(0.01), 0.5)])
