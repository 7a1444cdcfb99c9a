"""The ``[auth]`` config section, validated by :class:`AuthSettings`.

Example::

    [auth]
    pepper = { env = "SERVEHALL_AUTH_PEPPER" }   # server-side secret mixed into key hashes
    header_precedence = "authorization"           # when both Authorization and x-api-key arrive
    hide_forbidden_models = false                 # 404, not 403, for models outside the list
    default_rpm = 600                             # for principals without their own limits
    default_tpm = 200000
    limits_url = "redis://redis:6379/0"           # shared buckets + revocation broadcast
    limits_on_error = "closed"                    # or "open" (admit unlimited) on Redis errors

    [auth.tenants.team-a]                         # optional per-tenant limits
    rpm = 1200
    tpm = 500000
    priority = 5                                  # default scheduling priority
    max_priority = 8                              # requests may ask for up to 8

    [auth.jwt]
    issuer = "https://idp.example"
    audience = "servehall"
    algorithms = ["RS256", "ES256"]
    jwks_file = "/etc/servehall/jwks.json"      # and/or public_key_files = ["/etc/.../k.pem"]
    leeway_s = 30
    tenant_claim = "tenant"
    scopes_claim = "scope"
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

from servehall import SCOPE_INFERENCE, Secret

PRIORITY_LIMIT = 1000
"""Scheduling priorities (tenant defaults, keys, JWT claims) are integers in
[-PRIORITY_LIMIT, PRIORITY_LIMIT], the range of a request's ``priority`` field."""

#: Asymmetric algorithms a deployment may pin. ``none`` and the HMAC family are not
#: offered: tokens are verified with public keys only, and the token never picks.
JwtAlgorithm = Literal[
    "RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA"
]


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TenantSettings(_Section):
    """``[auth.tenants.<name>]``: limits shared by all of a tenant's principals
    (requests and tokens per minute; None means unlimited) and the tenant's prompt
    storage policy (``store_prompts``: True keeps prompt and completion text in
    ``request_log`` for the tenant's requests even when ``[database] store_prompts`` is
    off, False never keeps them, None follows ``[database] store_prompts``; it reaches
    the records layer as ``principal.policy.store_prompts``). ``priority`` is
    the default scheduling priority of the tenant's principals (those whose JWT carries
    none; larger runs first under ``[scheduler] policy = "priority"``), and
    ``max_priority`` the highest ``priority`` their requests may ask for (None: no higher
    than their own; more is clamped)."""

    rpm: int | None = Field(default=None, ge=1)
    tpm: int | None = Field(default=None, ge=1)
    store_prompts: bool | None = None
    priority: int | None = Field(default=None, ge=-PRIORITY_LIMIT, le=PRIORITY_LIMIT)
    max_priority: int | None = Field(default=None, ge=-PRIORITY_LIMIT, le=PRIORITY_LIMIT)


class JwtSettings(_Section):
    """``[auth.jwt]``: bearer JWTs verified with local public keys (no network fetch).

    ``issuer`` and ``audience`` are required and checked; ``algorithms`` is the pinned
    allow-list (the token's ``alg`` header must be one of them and must match the key
    type); ``leeway_s`` (seconds) applies to ``exp`` and ``nbf``. Claims map to the
    principal: ``subject_claim`` → id, ``tenant_claim`` → tenant, ``scopes_claim`` →
    scopes (space-separated string or list), ``models_claim`` → allowed models (absent
    means every model). ``rpm_claim``/``tpm_claim`` may carry per-subject limits,
    ``priority_claim`` a scheduling priority (an integer in [-1000, 1000]; else the
    tenant's default).
    """

    issuer: str = Field(min_length=1)
    audience: list[str] = Field(min_length=1)
    algorithms: list[JwtAlgorithm] = Field(min_length=1)
    jwks_file: Path | None = None
    public_key_files: list[Path] = Field(default_factory=list)
    leeway_s: float = Field(default=30.0, ge=0, le=300)
    subject_claim: str = "sub"
    tenant_claim: str = "tenant"
    scopes_claim: str = "scope"
    models_claim: str | None = "models"
    rpm_claim: str | None = None
    tpm_claim: str | None = None
    priority_claim: str | None = None
    default_scopes: list[str] = Field(default_factory=lambda: [SCOPE_INFERENCE])
    required_claims: list[str] = Field(default_factory=lambda: ["exp", "iat", "sub"])

    @field_validator("audience", mode="before")
    @classmethod
    def _one_or_many(cls, v: object) -> object:
        return [v] if isinstance(v, str) else v

    @model_validator(mode="after")
    def _has_keys(self) -> JwtSettings:
        if self.jwks_file is None and not self.public_key_files:
            raise ValueError("set jwks_file or public_key_files (JWT keys are never fetched)")
        return self


class AuthSettings(_Section):
    """``[auth]``: API keys, JWT, model visibility and rate limits.

    ``pepper`` (a secret: literal, ``{ env = ".." }`` or ``{ file = ".." }``, at least 16
    characters) is mixed into every key hash; it is required while ``api_keys`` is on.
    Changing it invalidates every stored key. ``database_url`` defaults to
    ``[database] url``. ``key_cache_ttl_s`` bounds how long a key looked up by one
    process stays cached (a revocation through the admin API of the same process takes
    effect at once; through the CLI or another replica within this many seconds).
    ``limits_url`` (a secret, since it may hold a password: ``redis://[user:password@]
    host:port/db``, ``rediss://`` for TLS, ``unix:///path.sock``) puts the rate-limit
    buckets in Redis or Valkey, shared by every replica, and broadcasts key revocations
    and rotations to every replica's key cache; unset, buckets live in the process.
    ``limits_on_error`` says what happens while that Redis cannot be reached:
    ``closed`` (default) answers 503 with ``Retry-After: limits_retry_after_s``,
    ``open`` admits without limits; both are logged and counted
    (``servehall_auth_limiter_errors_total``). ``limits_timeout_s`` bounds each Redis
    call (connect and reply). A replica refuses to start while ``limits_url`` cannot be
    reached.
    ``audit_failures_per_minute`` caps ``auth.failed`` audit events per process; the
    rest are counted and summarised in one ``auth.failed.suppressed`` event.
    """

    api_keys: bool = True
    pepper: Secret | None = None
    database_url: Secret | None = None
    header_precedence: Literal["authorization", "x-api-key"] = "authorization"
    hide_forbidden_models: bool = False
    default_rpm: int | None = Field(default=None, ge=1)
    default_tpm: int | None = Field(default=None, ge=1)
    tenants: dict[str, TenantSettings] = Field(default_factory=dict)
    key_cache_ttl_s: float = Field(default=2.0, ge=0, le=300)
    audit_failures_per_minute: int = Field(default=60, ge=0)
    limits_url: Secret | None = None
    limits_on_error: Literal["closed", "open"] = "closed"
    limits_timeout_s: float = Field(default=0.5, gt=0, le=30)
    limits_retry_after_s: int = Field(default=1, ge=1, le=3600)
    jwt: JwtSettings | None = None

    @field_validator("limits_url")
    @classmethod
    def _limits_url_form(cls, v: SecretStr | None) -> SecretStr | None:
        if v is not None:
            from servehall_auth.redis_limiter import check_limits_url

            check_limits_url(v.get_secret_value())
        return v

    @model_validator(mode="after")
    def _pepper_when_keys(self) -> AuthSettings:
        if self.api_keys:
            if self.pepper is None:
                raise ValueError('api_keys is on but pepper is not set (pepper = { env = "NAME" })')
            if len(self.pepper.get_secret_value()) < 16:
                raise ValueError("pepper must be at least 16 characters")
        if not self.api_keys and self.jwt is None:
            raise ValueError("enable api_keys or configure [auth.jwt]; nothing could log in")
        return self
