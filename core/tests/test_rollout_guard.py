"""The canary guard's judgement (:mod:`servehall.rollout.guard`)."""

from __future__ import annotations

from servehall.config.models import RollbackIf
from servehall.rollout.guard import OutcomeWindow, breach, p99


def _window(n: int, errors: int = 0, ttft: float = 0.1, at: float = 100.0) -> OutcomeWindow:
    w = OutcomeWindow(60)
    for i in range(n):
        w.add(at, i < errors, ttft)
    return w


def test_error_rate_breach_needs_min_requests() -> None:
    rule = RollbackIf(error_rate_above=0.02, min_requests=50)
    assert breach(rule, _window(49, errors=49), []) is None  # too few to judge
    found = breach(rule, _window(50, errors=2), [])
    assert found is not None and found[0] == "error_rate"
    assert breach(rule, _window(50, errors=1), []) is None  # 0.02 is not above 0.02


def test_ttft_p99_against_the_baseline() -> None:
    rule = RollbackIf(ttft_p99_above_baseline=1.5, min_requests=20)
    base = [_window(40, ttft=0.1)]
    assert breach(rule, _window(20, ttft=0.14), base) is None
    found = breach(rule, _window(20, ttft=0.2), base)
    assert found is not None and found[0] == "ttft_p99" and "baseline 100.0 ms" in found[1]
    assert breach(rule, _window(20, ttft=0.2), [_window(5, ttft=0.1)]) is None  # thin baseline


def test_window_slides() -> None:
    w = OutcomeWindow(10)
    w.add(0.0, True, None)
    w.add(5.0, False, 0.1)
    assert w.count == 2 and w.error_rate() == 0.5
    w.add(10.5, False, 0.1)
    assert w.count == 2 and w.error_rate() == 0.0


def test_p99_nearest_rank() -> None:
    assert p99([]) is None
    assert p99([float(i) for i in range(1, 101)]) == 99.0
    assert p99([3.0]) == 3.0
