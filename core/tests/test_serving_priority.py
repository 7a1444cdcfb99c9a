"""A request's scheduling priority: the principal's, lowered freely, raised only when
the principal may."""

from __future__ import annotations

import pytest

from servehall.errors import PermissionDeniedError
from servehall.principal import ANONYMOUS, Principal
from servehall.serving.priority import principal_priority, request_priority


def test_principal_priority_defaults_and_attributes() -> None:
    assert principal_priority(Principal(id="k")) == (0, False)
    p = Principal(id="k", attributes={"priority": 4, "may_raise_priority": True})
    assert principal_priority(p) == (4, True)
    assert principal_priority(Principal(id="k", attributes={"priority": "9"})) == (0, False)
    assert principal_priority(Principal(id="k", attributes={"priority": True})) == (0, False)
    assert principal_priority(ANONYMOUS) == (0, True)


def test_request_priority_rules() -> None:
    fixed = Principal(id="k", attributes={"priority": 2})
    assert request_priority(fixed, None) == 2
    assert request_priority(fixed, 2) == 2
    assert request_priority(fixed, -5) == -5  # lowering is always allowed
    with pytest.raises(PermissionDeniedError) as err:
        request_priority(fixed, 3)
    assert err.value.status == 403 and err.value.param == "priority"
    assert err.value.code == "priority_not_allowed"
    free = Principal(id="k", attributes={"priority": 2, "may_raise_priority": True})
    assert request_priority(free, 100) == 100
    assert request_priority(ANONYMOUS, 7) == 7
