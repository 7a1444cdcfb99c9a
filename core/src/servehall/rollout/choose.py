"""The request path's entry to the router: who may pin, and what makes a caller sticky."""

from __future__ import annotations

from typing import TYPE_CHECKING

from servehall.admission.principal import SCOPE_ADMIN, SCOPE_MODEL_VERSION, Principal
from servehall.errors import PermissionDeniedError
from servehall.rollout.router import VERSION_HEADER, VersionRouter

if TYPE_CHECKING:
    from servehall.api.state import ApiState
    from servehall.plugin.host import ServedModel


def sticky_key(principal: Principal, user: str | None) -> str | None:
    """The caller's routing key: the principal's id (an API key's id, ``jwt:<subject>``)
    plus the request's ``user`` field; None for an anonymous caller without ``user``
    (each request then picks afresh by weight)."""
    if principal.kind == "anonymous":
        return f"user:{user}" if user else None
    return f"{principal.id}\x00{user}" if user else principal.id


def may_pin(principal: Principal) -> bool:
    """Whether ``principal`` may pin a version (scope ``model_version`` or ``admin``)."""
    return principal.has_scope(SCOPE_MODEL_VERSION) or principal.has_scope(SCOPE_ADMIN)


def choose_version(
    api: ApiState, name: str, principal: Principal, user: str | None, pinned: str | None
) -> ServedModel | None:
    """The version of ``name`` that serves this request (None: not served; the caller
    answers 404 through :func:`~servehall.admission.access.check_model_access`).

    Raises:
        PermissionDeniedError: a pin header without the scope (403 ``insufficient_scope``).
        InvalidRequestError: a pin naming no version (400 ``model_version_not_found``).
    """
    if pinned is not None and not may_pin(principal):
        raise PermissionDeniedError(
            f"Pinning a version with {VERSION_HEADER} needs the '{SCOPE_MODEL_VERSION}' scope.",
            code="insufficient_scope",
        )
    router: VersionRouter = api.router
    return router.choose(name, sticky_key(principal, user), pinned)
