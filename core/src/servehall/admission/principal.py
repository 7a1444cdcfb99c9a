"""Who is calling, and what they may do: :class:`Principal` and its typed :class:`Policy`.

Auth plugins return a Principal from ``servehall_authenticate``; when no auth plugin is
enabled the host uses :data:`ANONYMOUS` (every scope, every model). The core reads only
typed fields of :class:`Policy` — there is no free-form dict a plugin and the core must
agree on by string key. Model access is decided in one place,
:func:`servehall.admission.access.check_model_access`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

SCOPE_INFERENCE = "inference"
SCOPE_ADMIN = "admin"
SCOPE_MODEL_VERSION = "model_version"
"""May pin a model version with the ``x-servehall-model-version`` header (``admin``
may too)."""


@dataclass(frozen=True, slots=True)
class Limits:
    """Per-principal rate limits; None means "no own limit" (a plugin may apply defaults).

    Attributes:
        rpm: requests per minute.
        tpm: tokens per minute (prompt + completion, reserved as prompt + max_tokens × n).
    """

    rpm: int | None = None
    tpm: int | None = None


@dataclass(frozen=True, slots=True)
class Policy:
    """What a principal may do; read by the core on the request path.

    Attributes:
        scopes: granted scopes, e.g. ``{"inference"}``, ``{"admin"}``.
        models: model names the caller may use; None means every model.
        limits: the principal's own rate limits (:class:`Limits`).
        store_prompts: the tenant's prompt-storage choice for ``request_log``: True keeps
            prompt and completion text, False never keeps them, None follows
            ``[database] store_prompts``.
        hide_forbidden_models: True: a model outside ``models`` is answered 404
            ``model_not_found`` exactly like an unknown one (it is also left out of
            ``/v1/models``); False: 403 ``model_not_allowed``.
        priority: scheduling priority of the caller's requests (larger runs first under
            the ``priority`` policy); None: the credential sets none (the auth plugin
            may apply the tenant's default), which runs at 0 (:attr:`level`).
        max_priority: the highest priority this caller may ask for per request; None
            means a request cannot raise its priority above ``priority``
            (see :meth:`request_priority`).
    """

    scopes: frozenset[str] = frozenset({SCOPE_INFERENCE})
    models: frozenset[str] | None = None
    limits: Limits = field(default_factory=Limits)
    store_prompts: bool | None = None
    hide_forbidden_models: bool = True
    priority: int | None = None
    max_priority: int | None = None

    @property
    def level(self) -> int:
        """The priority the caller's requests run at when they ask for none (0 when
        :attr:`priority` is None)."""
        return 0 if self.priority is None else self.priority

    def has_scope(self, scope: str) -> bool:
        """True when ``scope`` was granted."""
        return scope in self.scopes

    def may_use(self, model: str) -> bool:
        """True when the model allow-list is absent or contains ``model``."""
        return self.models is None or model in self.models

    def request_priority(self, requested: int | None) -> int:
        """The priority a request runs at when it asks for ``requested`` (None: not asked).

        A request may lower its priority freely and raise it up to ``max_priority``
        (never above ``priority`` when ``max_priority`` is None); the result is clamped,
        never an error.
        """
        level = self.level
        if requested is None:
            return level
        ceiling = level if self.max_priority is None else max(self.max_priority, level)
        return min(requested, ceiling)


@dataclass(frozen=True, slots=True)
class Principal:
    """An authenticated caller.

    Attributes:
        id: stable, non-secret identifier (an API key's public id such as ``sh-ab12…``,
            or ``jwt:<subject>``). Safe to log.
        tenant: the tenant (team, organisation) the caller belongs to, or None.
        kind: how it authenticated: ``"api_key"``, ``"jwt"``, ``"anonymous"``.
        name: a human label (an API key's name), or None. Never a secret.
        policy: what the caller may do (:class:`Policy`).
    """

    id: str
    tenant: str | None = None
    kind: str = "api_key"
    name: str | None = None
    policy: Policy = field(default_factory=Policy)

    def has_scope(self, scope: str) -> bool:
        """True when ``scope`` was granted (``policy.has_scope``)."""
        return self.policy.has_scope(scope)


ANONYMOUS = Principal(
    id="anonymous",
    tenant=None,
    kind="anonymous",
    policy=Policy(scopes=frozenset({SCOPE_INFERENCE, SCOPE_ADMIN}), models=None),
)
"""The principal used when no auth plugin is enabled."""
