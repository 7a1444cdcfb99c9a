"""A request's scheduling priority, from its principal and (within limits) its body.

The only place the request path reads scheduling facts from a :class:`Principal`:
``principal.policy.priority`` (a key's or JWT's own priority or its tenant's default, set
by the auth plugin; 0 when absent) and ``principal.policy.max_priority`` (the highest priority a
request may ask for; None: no higher than ``priority``). Without an auth plugin every
caller is the anonymous principal; nobody is more trusted than anybody else, so its
requests may ask for any priority (as on vLLM).
"""

from __future__ import annotations

from servehall.admission.principal import Principal


def request_priority(principal: Principal, requested: int | None) -> int:
    """The priority a request is scheduled with: its principal's when it asks for none;
    else what it asks for, clamped to the principal's ceiling (lowering is always
    allowed, raising only up to ``policy.max_priority``; see
    :meth:`~servehall.admission.principal.Policy.request_priority`). The anonymous principal (no
    auth plugin) may ask for any priority. Never an error."""
    if principal.kind == "anonymous":
        return principal.policy.level if requested is None else requested
    return principal.policy.request_priority(requested)
