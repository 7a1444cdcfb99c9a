"""Benchmark arithmetic: per-request timings in, vLLM-style summary metrics out.

Definitions follow vLLM's serving benchmark (``vllm/benchmarks/serve.py``,
``calculate_metrics``), so figures compare one to one with ``vllm bench serve``:

* **TTFT** (time to first token): request sent → first output token received.
* **TPOT** (time per output token, excluding the first): per request,
  ``(e2e − ttft) / (output_tokens − 1)``; only requests with more than one output token.
* **ITL** (inter-token latency): every gap between consecutive token arrivals, pooled
  over all requests (a chunk carrying k tokens counts as one arrival, as in vLLM).
* **E2E latency** (E2EL): request sent → last token received.
* **request throughput** = completed ÷ duration; **output throughput** = output tokens ÷
  duration; **total token throughput** = (prompt + output tokens) ÷ duration.
* **goodput** (Zhong et al., "DistServe", OSDI 2024; vLLM's ``--goodput``): completed
  requests that meet *every* given SLO (``ttft``, ``tpot``, ``e2el`` in ms; a request
  with one output token has TPOT 0) ÷ duration.
* percentiles use linear interpolation between closest ranks (NumPy's default
  ``np.percentile`` method): the p-th percentile of sorted ``x[0..n-1]`` is
  ``x[k] + (x[k+1] − x[k])·f`` with ``k + f = (n − 1)·p / 100``.

All times are seconds in :class:`RequestOutput`; summaries report milliseconds.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

PERCENTILES: tuple[float, ...] = (50.0, 90.0, 99.0)
"""Percentiles reported for every latency metric."""

SLO_METRICS: tuple[str, ...] = ("ttft", "tpot", "e2el")
"""Metric names accepted in ``--slo`` (values in milliseconds)."""


@dataclass(slots=True)
class RequestOutput:
    """What one benchmark request measured.

    Attributes:
        success: the request completed with a 2xx and a complete stream.
        prompt_tokens: prompt length in tokens (from the server's usage when it reports
            it, else the workload's count).
        output_tokens: generated tokens (usage, else one per content chunk).
        start: when the request was sent, seconds on the run's clock (``perf_counter``
            relative to the run start).
        ttft: seconds from send to the first token (0 when none arrived).
        latency: seconds from send to the last token / end of stream.
        itl: seconds between consecutive token arrivals (``len == arrivals − 1``).
        token_times: run-clock arrival time of each chunk (for throughput over time).
        status: HTTP status (None for in-process runs or transport failures).
        error: a one-line reason when ``success`` is False.
    """

    success: bool = False
    prompt_tokens: int = 0
    output_tokens: int = 0
    start: float = 0.0
    ttft: float = 0.0
    latency: float = 0.0
    itl: list[float] = field(default_factory=list)
    token_times: list[float] = field(default_factory=list)
    status: int | None = None
    error: str = ""

    @property
    def tpot(self) -> float | None:
        """Seconds per output token after the first; None with fewer than two tokens."""
        if self.output_tokens <= 1:
            return None
        return (self.latency - self.ttft) / (self.output_tokens - 1)


def percentile(values: Sequence[float], p: float) -> float:
    """The ``p``-th percentile (0..100) of ``values`` by linear interpolation (NumPy's
    default). Raises ValueError on an empty sequence or ``p`` outside [0, 100]."""
    if not values:
        raise ValueError("percentile of an empty sequence")
    if not 0 <= p <= 100:
        raise ValueError(f"percentile {p} outside [0, 100]")
    xs = sorted(values)
    rank = (len(xs) - 1) * p / 100
    lo = math.floor(rank)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (rank - lo)


@dataclass(frozen=True, slots=True)
class Distribution:
    """Mean, median, standard deviation and :data:`PERCENTILES` of one metric, in ms."""

    mean: float = 0.0
    median: float = 0.0
    std: float = 0.0
    percentiles: dict[str, float] = field(default_factory=dict)
    count: int = 0

    @classmethod
    def of_seconds(cls, values: Sequence[float]) -> Distribution:
        """Summarise ``values`` (seconds) in milliseconds; all zeros when empty
        (vLLM reports 0 for a metric without samples)."""
        if not values:
            return cls(percentiles={_pname(p): 0.0 for p in PERCENTILES})
        ms = [v * 1000 for v in values]
        mean = sum(ms) / len(ms)
        std = math.sqrt(sum((v - mean) ** 2 for v in ms) / len(ms))  # population, as np.std
        return cls(
            mean=mean,
            median=percentile(ms, 50),
            std=std,
            percentiles={_pname(p): percentile(ms, p) for p in PERCENTILES},
            count=len(ms),
        )


def _pname(p: float) -> str:
    return f"p{p:g}"


def parse_slo(text: str | None) -> dict[str, float]:
    """``"ttft=500,tpot=50"`` → ``{"ttft": 500.0, "tpot": 50.0}`` (milliseconds).

    ``:`` is accepted in place of ``=`` (vLLM's ``--goodput ttft:500``) and spaces in
    place of commas. Raises ValueError naming the bad part: an unknown metric (not in
    :data:`SLO_METRICS`), a value that is not a positive number, or a repeated metric.
    """
    if text is None or not text.strip():
        return {}
    out: dict[str, float] = {}
    for part in text.replace(",", " ").split():
        name, sep, value = part.replace(":", "=").partition("=")
        name = name.strip().lower()
        if not sep:
            raise ValueError(f"SLO {part!r} is not NAME=MILLISECONDS")
        if name not in SLO_METRICS:
            raise ValueError(f"unknown SLO metric {name!r}; known: {', '.join(SLO_METRICS)}")
        if name in out:
            raise ValueError(f"SLO metric {name!r} given twice")
        try:
            ms = float(value)
        except ValueError:
            raise ValueError(f"SLO {part!r}: {value!r} is not a number of milliseconds") from None
        if not math.isfinite(ms) or ms <= 0:
            raise ValueError(f"SLO {part!r}: the limit must be a positive number of ms")
        out[name] = ms
    return out


def meets_slo(out: RequestOutput, slo: Mapping[str, float]) -> bool:
    """True when a successful request is within every SLO (ms, inclusive)."""
    if not out.success:
        return False
    values = {"ttft": out.ttft, "tpot": out.tpot or 0.0, "e2el": out.latency}
    return all(values[name] * 1000 <= limit for name, limit in slo.items())


@dataclass(slots=True)
class BenchSummary:
    """The figures of one benchmark run (see the module docstring for definitions).

    Throughputs are per second of ``duration_s``; latency distributions are in ms.
    ``goodput`` is requests/s, None when no SLO was given.
    """

    completed: int
    failed: int
    failures: dict[str, int]
    duration_s: float
    total_input_tokens: int
    total_output_tokens: int
    request_throughput: float
    output_throughput: float
    total_token_throughput: float
    ttft_ms: Distribution
    tpot_ms: Distribution
    itl_ms: Distribution
    e2el_ms: Distribution
    slo: dict[str, float] = field(default_factory=dict)
    good_completed: int | None = None
    goodput: float | None = None
    cpu_s: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (``--output-json``)."""
        return asdict(self)


def failure_key(out: RequestOutput) -> str:
    """How a failed request is counted: ``"HTTP 401"``, or its error's first word(s)."""
    if out.status is not None and out.status >= 300:
        return f"HTTP {out.status}"
    return out.error.split(":", 1)[0][:60] or "error"


def summarize(
    outputs: Sequence[RequestOutput],
    duration_s: float,
    slo: Mapping[str, float] | None = None,
    cpu_s: float | None = None,
) -> BenchSummary:
    """Compute every metric of a run from its per-request outputs.

    Args:
        outputs: one entry per request sent (successful or not).
        duration_s: wall time of the run in seconds (> 0; first send → last completion).
        slo: limits in ms by metric name (see :func:`parse_slo`); empty/None = no goodput.
        cpu_s: CPU seconds to report alongside (optional).

    Raises:
        ValueError: ``duration_s`` is not positive.
    """
    if not duration_s > 0:
        raise ValueError(f"duration must be positive, got {duration_s}")
    ok = [o for o in outputs if o.success]
    failures: dict[str, int] = {}
    for o in outputs:
        if not o.success:
            key = failure_key(o)
            failures[key] = failures.get(key, 0) + 1
    input_tokens = sum(o.prompt_tokens for o in ok)
    output_tokens = sum(o.output_tokens for o in ok)
    tpots = [t for o in ok if (t := o.tpot) is not None]
    summary = BenchSummary(
        completed=len(ok),
        failed=len(outputs) - len(ok),
        failures=failures,
        duration_s=duration_s,
        total_input_tokens=input_tokens,
        total_output_tokens=output_tokens,
        request_throughput=len(ok) / duration_s,
        output_throughput=output_tokens / duration_s,
        total_token_throughput=(input_tokens + output_tokens) / duration_s,
        ttft_ms=Distribution.of_seconds([o.ttft for o in ok]),
        tpot_ms=Distribution.of_seconds(tpots),
        itl_ms=Distribution.of_seconds([x for o in ok for x in o.itl]),
        e2el_ms=Distribution.of_seconds([o.latency for o in ok]),
        cpu_s=cpu_s,
    )
    if slo:
        summary.slo = dict(slo)
        summary.good_completed = sum(1 for o in ok if meets_slo(o, slo))
        summary.goodput = summary.good_completed / duration_s
    return summary


def throughput_series(
    outputs: Sequence[RequestOutput], duration_s: float, bins: int = 50
) -> tuple[list[float], list[float]]:
    """Output tokens per second over time: ``(bin_centres_s, tokens_per_s)`` in ``bins``
    equal bins of ``[0, duration_s]``; a chunk's tokens count at its arrival time
    (spread evenly when the arrival list is shorter than the token count)."""
    width = duration_s / bins if duration_s > 0 else 1.0
    counts = [0.0] * bins
    for o in outputs:
        if not o.success or not o.token_times:
            continue
        per = o.output_tokens / len(o.token_times)
        for t in o.token_times:
            counts[min(int(t / width), bins - 1)] += per
    return [width * (i + 0.5) for i in range(bins)], [c / width for c in counts]
