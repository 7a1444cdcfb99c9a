"""A request's scheduling priority: the principal's, lowered freely, raised only up to
the principal's ``max_priority`` (clamped, never an error)."""

from __future__ import annotations

from servehall.admission.principal import ANONYMOUS, Policy, Principal
from servehall.serving.priority import request_priority


def test_request_priority_rules() -> None:
    fixed = Principal(id="k", policy=Policy(priority=2))
    assert request_priority(fixed, None) == 2
    assert request_priority(fixed, 2) == 2
    assert request_priority(fixed, -5) == -5  # lowering is always allowed
    assert request_priority(fixed, 3) == 2  # raising without the right: clamped
    free = Principal(id="k", policy=Policy(priority=2, max_priority=10))
    assert request_priority(free, 7) == 7
    assert request_priority(free, 100) == 10
    low_ceiling = Principal(id="k", policy=Policy(priority=4, max_priority=1))
    assert request_priority(low_ceiling, 9) == 4  # the ceiling is never below the priority
    assert request_priority(Principal(id="k"), None) == 0


def test_anonymous_may_ask_for_any_priority() -> None:
    assert request_priority(ANONYMOUS, None) == 0
    assert request_priority(ANONYMOUS, 700) == 700
    assert request_priority(ANONYMOUS, -3) == -3
