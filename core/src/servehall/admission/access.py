"""Who may use which model: the one place the request path decides model access.

Step 3 of the request path (before the ``servehall_authorize`` hooks reserve quota) and
``GET /v1/models`` both ask this module, so the scope check, the model allow-list and
the 404-versus-403 choice (``Policy.hide_forbidden_models``) cannot disagree.
"""

from __future__ import annotations

from servehall.admission.principal import SCOPE_INFERENCE, Principal
from servehall.errors import NotFoundError, PermissionDeniedError


def check_model_access(principal: Principal, model: str, *, served: bool) -> None:
    """Refuse an inference request for ``model`` that ``principal`` may not make.

    Args:
        principal: the caller.
        model: the requested model name.
        served: whether this host serves a model of that name.

    Raises:
        PermissionDeniedError: no ``inference`` scope (403 ``insufficient_scope``), or a
            model outside the allow-list while ``hide_forbidden_models`` is False (403
            ``model_not_allowed``).
        NotFoundError: an unknown model, or one outside the allow-list while
            ``hide_forbidden_models`` is True (404 ``model_not_found`` either way, so a
            caller cannot tell the two apart).
    """
    policy = principal.policy
    if not policy.has_scope(SCOPE_INFERENCE):
        raise PermissionDeniedError(
            "This credential lacks the 'inference' scope.", code="insufficient_scope"
        )
    allowed = policy.may_use(model)
    if not served or (not allowed and policy.hide_forbidden_models):
        raise NotFoundError(
            f"The model `{model}` does not exist or you do not have access to it.",
            param="model",
            code="model_not_found",
        )
    if not allowed:
        raise PermissionDeniedError(
            f"This credential may not use the model `{model}`.",
            param="model",
            code="model_not_allowed",
        )
