"""A request's scheduling priority, from its principal and (within limits) its body.

The only place the request path reads scheduling facts from a :class:`Principal`:
``principal.attributes["priority"]`` (int; a JWT's priority claim or its tenant's
default, set by the auth plugin; 0 when absent) and ``principal.attributes
["max_priority"]`` (int; the highest priority a request may ask for; absent: no higher
than ``priority``). Without an auth plugin every caller is the anonymous principal;
nobody is more trusted than anybody else, so its requests may ask for any priority (as on
vLLM).
"""

from __future__ import annotations

from servehall.principal import Principal


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def principal_priority(principal: Principal) -> tuple[int, int | None]:
    """``(priority, ceiling)`` of ``principal``: its priority (default 0; larger runs
    first under the ``priority`` policy) and the most a request may ask for (None: no
    limit, for the anonymous principal)."""
    priority = _int(principal.attributes.get("priority")) or 0
    if principal.kind == "anonymous":
        return priority, None
    ceiling = _int(principal.attributes.get("max_priority"))
    return priority, max(priority, ceiling if ceiling is not None else priority)


def request_priority(principal: Principal, requested: int | None) -> int:
    """The priority a request is scheduled with: its principal's when it asks for none;
    else what it asks for, clamped to the principal's ceiling (lowering is always
    allowed, raising only up to ``max_priority``). Never an error."""
    own, ceiling = principal_priority(principal)
    if requested is None:
        return own
    return requested if ceiling is None else min(requested, ceiling)
