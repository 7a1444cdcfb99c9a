"""``servehall.plugin.outcomes``: a version's window of ended requests and the breach a
canary is rolled back for."""

from __future__ import annotations

from datetime import UTC, datetime

from servehall.plugin.outcomes import Breach, OutcomeWindow


def test_an_empty_window() -> None:
    w = OutcomeWindow(60.0)
    assert (w.count, w.errors(), w.error_rate(), w.ttfts()) == (0, 0, 0.0, [])


def test_counts_errors_and_ttfts_of_the_window() -> None:
    w = OutcomeWindow(60.0)
    w.add(100.0, False, 0.2)
    w.add(101.0, True, None)
    w.add(102.0, False, 0.4)
    w.add(103.0, True, 0.1)
    assert w.count == 4 and w.errors() == 2 and w.error_rate() == 0.5
    assert w.ttfts() == [0.2, 0.4, 0.1]


def test_old_entries_leave_on_the_next_add_or_prune() -> None:
    w = OutcomeWindow(10.0)
    w.add(0.0, True, None)
    w.add(5.0, False, 0.1)
    w.add(10.0, False, 0.1)  # the entry at 0 is exactly at the edge: kept
    assert w.count == 3
    w.add(10.5, False, 0.1)
    assert w.count == 3 and w.errors() == 0
    w.prune(100.0)
    assert w.count == 0


def test_a_breach_marker_is_cut_and_stamped() -> None:
    b = Breach("error_rate", "x" * 600, {"requests": 20})
    before = datetime.now(UTC).replace(microsecond=0)
    marker = b.marker("r" * 200)
    assert marker["reason"] == "error_rate"
    assert len(marker["detail"]) == 500 and len(marker["by"]) == 128
    at = datetime.fromisoformat(marker["at"])
    assert at.tzinfo is not None and at >= before
    assert b.figures == {"requests": 20}
