"""Who is calling: the :class:`Principal` that authentication yields.

Auth plugins return a Principal from ``servehall_authenticate``; when no auth plugin is
enabled the host uses :data:`ANONYMOUS` (every scope, every model).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

SCOPE_INFERENCE = "inference"
SCOPE_ADMIN = "admin"


@dataclass(frozen=True, slots=True)
class Principal:
    """An authenticated caller.

    Attributes:
        id: stable, non-secret identifier (an API key id such as ``sk-ab12`` prefix id, or
            a JWT subject). Safe to log.
        tenant: the tenant (team, organisation) the caller belongs to, or None.
        scopes: granted scopes, e.g. ``{"inference"}``, ``{"admin"}``.
        models: model names the caller may use; None means all models.
        kind: how it authenticated: ``"api_key"``, ``"jwt"``, ``"anonymous"``.
        limits: plugin-defined limits (e.g. ``{"rpm": 60, "tpm": 10000}``).
        attributes: other non-secret facts a plugin wants to pass along. Keys the core
            reads: ``hide_forbidden_models`` (bool, default True: a model outside
            ``models`` is answered 404 like an unknown one; False: 403),
            ``store_prompts`` (per-tenant prompt storage), ``priority`` (scheduling).
    """

    id: str
    tenant: str | None = None
    scopes: frozenset[str] = frozenset({SCOPE_INFERENCE})
    models: frozenset[str] | None = None
    kind: str = "api_key"
    limits: dict[str, Any] = field(default_factory=dict)
    attributes: dict[str, Any] = field(default_factory=dict)

    def has_scope(self, scope: str) -> bool:
        """True when ``scope`` was granted."""
        return scope in self.scopes

    def may_use(self, model: str) -> bool:
        """True when the model allow-list is absent or contains ``model``."""
        return self.models is None or model in self.models


ANONYMOUS = Principal(
    id="anonymous",
    tenant=None,
    scopes=frozenset({SCOPE_INFERENCE, SCOPE_ADMIN}),
    models=None,
    kind="anonymous",
)
"""The principal used when no auth plugin is enabled."""
