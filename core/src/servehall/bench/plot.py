"""``--plot FILE.png``: latency CDFs (TTFT, TPOT, ITL, E2E) and output throughput over
time, one figure, one line per run (matplotlib, Agg backend; extra ``servehall[bench]``)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from servehall.bench.metrics import RequestOutput, throughput_series


class PlotError(Exception):
    """matplotlib is missing or the file cannot be written (one line for the user)."""


def _cdf(values: Sequence[float]) -> tuple[list[float], list[float]]:
    xs = sorted(v * 1000 for v in values)
    n = len(xs)
    return xs, [(i + 1) / n for i in range(n)]


def plot_runs(
    path: Path, runs: Sequence[tuple[str, Sequence[RequestOutput], float]], title: str = ""
) -> Path:
    """Draw ``runs`` (``(label, outputs, duration_s)``) into ``path`` (PNG) and return it.

    Raises PlotError when matplotlib is not installed or the file cannot be written."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise PlotError("--plot needs matplotlib (pip install 'servehall[bench]')") from None
    fig, axes = plt.subplots(2, 3, figsize=(15, 8.5))
    panels = [
        ("TTFT", lambda o: [o.ttft]),
        ("TPOT", lambda o: [] if o.tpot is None else [o.tpot]),
        ("ITL", lambda o: o.itl),
        ("E2E latency", lambda o: [o.latency]),
    ]
    for ax, (name, pick) in zip(axes.flat[:4], panels, strict=True):
        for label, outputs, _ in runs:
            values = [v for o in outputs if o.success for v in pick(o)]
            if values:
                xs, ys = _cdf(values)
                ax.step(xs, ys, where="post", label=label)
        ax.set_title(f"{name} CDF")
        ax.set_xlabel("ms")
        ax.set_ylabel("fraction of samples")
        ax.grid(alpha=0.3)
    tp = axes.flat[4]
    for label, outputs, duration in runs:
        xs, ys = throughput_series(outputs, duration, bins=max(5, min(50, int(duration / 0.05))))
        tp.plot(xs, ys, label=label)
    tp.set_title("output throughput over time")
    tp.set_xlabel("s since start")
    tp.set_ylabel("tokens/s")
    tp.grid(alpha=0.3)
    done = axes.flat[5]
    for label, outputs, _ in runs:
        ends = sorted(o.start + o.latency for o in outputs if o.success)
        done.step(ends, range(1, len(ends) + 1), where="post", label=label)
    done.set_title("completed requests over time")
    done.set_xlabel("s since start")
    done.set_ylabel("requests")
    done.grid(alpha=0.3)
    for ax in axes.flat if len(runs) > 1 else ():
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize="small")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=100)
    except OSError as exc:
        raise PlotError(f"cannot write {path}: {exc}") from None
    finally:
        plt.close(fig)
    return path
