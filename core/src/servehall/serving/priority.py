"""A request's scheduling priority, from its principal and (when allowed) its body.

The only place the request path reads scheduling facts from a :class:`Principal`:
``principal.attributes["priority"]`` (int; an API key's or JWT's priority, or its
tenant's default, set by the auth plugin; 0 when absent) and
``principal.attributes["may_raise_priority"]`` (bool; whether the request's ``priority``
field may ask for more than that). Without an auth plugin every caller is the anonymous
principal; nobody is more trusted than anybody else, so its requests may set any
``priority`` (as on vLLM).
"""

from __future__ import annotations

from servehall.errors import PermissionDeniedError
from servehall.principal import Principal


def principal_priority(principal: Principal) -> tuple[int, bool]:
    """``(priority, may_raise)`` of ``principal``: its priority (default 0; larger runs
    first under the ``priority`` policy) and whether a request may ask for more."""
    raw = principal.attributes.get("priority")
    priority = raw if isinstance(raw, int) and not isinstance(raw, bool) else 0
    if principal.kind == "anonymous":
        return priority, True
    return priority, bool(principal.attributes.get("may_raise_priority", False))


def request_priority(principal: Principal, requested: int | None) -> int:
    """The priority a request is scheduled with.

    A request without ``priority`` gets its principal's. One that asks for at most the
    principal's priority gets what it asked for (lowering is always allowed); more is
    allowed only when the principal may raise it.

    Raises:
        PermissionDeniedError: (403, ``param: "priority"``) above the principal's
            priority without the right to raise it.
    """
    own, may_raise = principal_priority(principal)
    if requested is None:
        return own
    if requested > own and not may_raise:
        raise PermissionDeniedError(
            f"This credential may not raise its priority above {own}.",
            param="priority",
            code="priority_not_allowed",
        )
    return requested
