"""servehall.admission.demand: the online-demand count, its listeners and quiet time."""

from __future__ import annotations

from servehall.admission.demand import OnlineDemand


def test_begin_counts_and_calls_listeners_end_starts_the_quiet_time() -> None:
    now = [100.0]
    demand = OnlineDemand(clock=lambda: now[0])
    calls: list[int] = []
    demand.listeners.append(lambda: calls.append(demand.inflight))
    assert demand.quiet_for() == float("inf")  # none ever ran
    demand.begin()
    demand.begin()
    assert calls == [1, 2] and demand.quiet_for() == 0.0
    demand.end()
    now[0] = 105.0
    assert demand.quiet_for() == 0.0  # one still in flight
    demand.end()
    now[0] = 106.5
    assert demand.inflight == 0 and demand.quiet_for() == 1.5
    demand.end()  # an extra end never goes below zero
    assert demand.inflight == 0


def test_a_failing_listener_does_not_stop_the_others() -> None:
    demand = OnlineDemand()
    got: list[str] = []

    def bad() -> None:
        raise RuntimeError("boom")

    demand.listeners += [bad, lambda: got.append("ok")]
    demand.begin()
    assert got == ["ok"] and demand.inflight == 1
