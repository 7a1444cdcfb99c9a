"""A request's scheduling priority: the principal's, lowered freely, raised only up to
the principal's ``max_priority`` (clamped, never an error)."""

from __future__ import annotations

from servehall.principal import ANONYMOUS, Principal
from servehall.serving.priority import principal_priority, request_priority


def test_principal_priority_defaults_and_attributes() -> None:
    assert principal_priority(Principal(id="k")) == (0, 0)
    p = Principal(id="k", attributes={"priority": 4, "max_priority": 9})
    assert principal_priority(p) == (4, 9)
    p = Principal(id="k", attributes={"priority": 4, "max_priority": 1})
    assert principal_priority(p) == (4, 4)  # the ceiling is never below the priority
    assert principal_priority(Principal(id="k", attributes={"priority": "9"})) == (0, 0)
    assert principal_priority(Principal(id="k", attributes={"priority": True})) == (0, 0)
    assert principal_priority(ANONYMOUS) == (0, None)


def test_request_priority_rules() -> None:
    fixed = Principal(id="k", attributes={"priority": 2})
    assert request_priority(fixed, None) == 2
    assert request_priority(fixed, 2) == 2
    assert request_priority(fixed, -5) == -5  # lowering is always allowed
    assert request_priority(fixed, 3) == 2  # raising without the right: clamped
    free = Principal(id="k", attributes={"priority": 2, "max_priority": 10})
    assert request_priority(free, 7) == 7
    assert request_priority(free, 100) == 10
    assert request_priority(ANONYMOUS, 700) == 700
