"""The auth plugin's per-process state: key store, JWT verifier, rate limiter, auditor.

Built at ``servehall_startup`` (:meth:`AuthRuntime.start`) and closed at shutdown. With
``[auth] limits_url`` the rate-limit buckets live in Redis (shared by every replica) and
key revocations/rotations are broadcast over the same Redis (see
:mod:`servehall_auth.broadcast`); without it, buckets are in-process.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import TYPE_CHECKING

from servehall import AdmissionRequest, AuditEvent, Principal
from servehall_auth.audit import AuditFn, FailureAuditor
from servehall_auth.authn import Authenticator
from servehall_auth.limiter import LimiterStore, MemoryLimiterStore
from servehall_auth.ratelimit import RateLimiter, TokenReservation
from servehall_auth.settings import AuthSettings

if TYPE_CHECKING:
    from servehall import DbTimeouts
    from servehall_auth.jwt_verify import JwtVerifier
    from servehall_auth.store import KeyStore

log = logging.getLogger("servehall_auth")


async def _check_pepper(keys: KeyStore) -> None:
    """Warn (once, at start) when active keys exist but none was made with the configured
    pepper: a pepper taken from a shell variable that died with the shell, or a new
    secret file, silently turns every key into a 401."""
    report = await keys.pepper_report()
    if report.mismatch:
        log.warning(
            "auth: none of the %d active API key(s) was made with the configured pepper "
            "(fingerprint %s); every such key will be refused with 401. Was [auth] pepper "
            "changed or lost? Restore the pepper the keys were made with, or create new keys.",
            report.known,
            keys.pepper_fp,
        )
    elif report.active:
        log.info(
            "auth: %d active API key(s); %d made with the configured pepper (fingerprint %s)",
            report.active,
            report.matching,
            keys.pepper_fp,
        )


class AuthRuntime:
    """Everything the hooks need, for one host process.

    Args:
        settings: the validated ``[auth]`` section.
        keys: the key store, or None when API keys are off.
        jwt: the JWT verifier, or None without ``[auth.jwt]``.
        audit: where audit events go (``host.records.audit``); must not block or raise.
        limiter_store: bucket storage (default: in-process).
    """

    def __init__(
        self,
        settings: AuthSettings,
        keys: KeyStore | None,
        jwt: JwtVerifier | None,
        audit: AuditFn,
        limiter_store: LimiterStore | None = None,
    ) -> None:
        self.settings = settings
        self.keys = keys
        self.jwt = jwt
        self._audit = audit
        self.auditor = FailureAuditor(self.audit, settings.audit_failures_per_minute)
        self.authenticator = Authenticator(settings, keys, jwt, self.auditor)
        self.limiter = RateLimiter(limiter_store or MemoryLimiterStore(), settings)
        self._on_close: list[Callable[[], None]] = []
        self._on_aclose: list[Callable[[], Awaitable[None]]] = []

    @classmethod
    async def start(
        cls,
        settings: AuthSettings,
        database_url: str,
        audit: AuditFn,
        timeouts: DbTimeouts | None = None,
    ) -> AuthRuntime:
        """Open the key store (checking the ``api_key`` table exists) and load JWT keys.

        ``timeouts``: the ``[database]`` timeouts (:meth:`servehall.DbTimeouts.of`); the
        key store's PostgreSQL sessions run under them and a key lookup fails (503
        ``auth_unavailable``) after ``command_s`` seconds. None: no bounds.

        Raises:
            ConfigError: the table is missing or JWT key material cannot be loaded.
        """
        keys = None
        if settings.api_keys:
            from servehall_auth.store import KeyStore, close_store, make_engine

            assert settings.pepper is not None  # enforced by AuthSettings
            url = (
                settings.database_url.get_secret_value() if settings.database_url else database_url
            )
            keys = KeyStore(
                make_engine(url, timeouts),
                settings.pepper.get_secret_value(),
                cache_ttl_s=settings.key_cache_ttl_s,
                lookup_timeout_s=timeouts.command_s if timeouts is not None else 0.0,
            )
            try:
                await keys.check_schema()
                await _check_pepper(keys)
            except BaseException:
                await close_store(keys)
                raise
        jwt = None
        closers: list[Callable[[], Awaitable[None]]] = []
        store: LimiterStore | None = None
        try:
            if settings.jwt is not None:
                from servehall_auth.jwt_verify import JwtVerifier

                jwt = JwtVerifier(settings.jwt)
            if settings.limits_url is not None:
                store, more = await _shared_limits(settings, keys)
                closers += more
        except BaseException:
            for fn in reversed(closers):
                await fn()
            if keys is not None:
                from servehall_auth.store import close_store

                await close_store(keys)
            raise
        rt = cls(settings, keys, jwt, audit, store)
        rt._on_aclose += closers
        return rt

    def on_close(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` when the runtime closes (e.g. remove the log filter)."""
        self._on_close.append(fn)

    async def close(self) -> None:
        """Stop the broadcast listener, close Redis and the database pool, and run the
        ``on_close`` callbacks."""
        for afn in reversed(self._on_aclose):
            with contextlib.suppress(Exception):
                await afn()
        self._on_aclose.clear()
        if self.keys is not None:
            from servehall_auth.store import close_store

            await close_store(self.keys)
        for fn in reversed(self._on_close):
            fn()
        self._on_close.clear()

    def audit(self, event: AuditEvent) -> None:
        """Send an audit event; a failing sink is logged, never raised to the caller."""
        try:
            self._audit(event)
        except Exception as exc:  # the records layer must not break authentication
            log.warning("audit event %s not recorded: %s", event.action, type(exc).__name__)

    async def authenticate(
        self, authorization: list[str], x_api_key: list[str], *, path: str, client: str | None
    ) -> Principal | None:
        """See :meth:`Authenticator.authenticate`; completes the principal's policy with
        ``[auth] hide_forbidden_models`` and its tenant's ``store_prompts``, and, where
        the credential (the key's ``priority`` / ``max_priority``, the JWT's priority
        claim) sets none, the tenant's scheduling ``priority`` and ``max_priority``."""
        principal = await self.authenticator.authenticate(
            authorization, x_api_key, path=path, client=client
        )
        if principal is None:
            return None
        own = principal.policy
        store_prompts, priority, max_priority = own.store_prompts, own.priority, own.max_priority
        tenant = self.settings.tenants.get(principal.tenant) if principal.tenant else None
        if tenant is not None:
            if tenant.store_prompts is not None:
                store_prompts = tenant.store_prompts
            if tenant.priority is not None and own.priority is None:
                priority = tenant.priority
            if tenant.max_priority is not None and own.max_priority is None:
                max_priority = tenant.max_priority
        policy = replace(
            principal.policy,
            hide_forbidden_models=self.settings.hide_forbidden_models,
            store_prompts=store_prompts,
            priority=priority,
            max_priority=max_priority,
        )
        return replace(principal, policy=policy)

    async def authorize(self, request: AdmissionRequest) -> TokenReservation | None:
        """The rate-limit reservation (scope and model access are the core's:
        :func:`servehall.admission.access.check_model_access` runs before this hook).

        Raises:
            RateLimitError: over a limit (429).
        """
        return await self.limiter.reserve(request)


async def _shared_limits(
    settings: AuthSettings, keys: KeyStore | None
) -> tuple[LimiterStore, list[Callable[[], Awaitable[None]]]]:
    """Connect the Redis limiter store and, with API keys, the key-change broadcast.

    Returns the store and the coroutines that close what was opened.

    Raises:
        ConfigError: Redis cannot be reached (one line, password masked).
    """
    from servehall_auth.broadcast import KeyChangeListener, publish_key_change
    from servehall_auth.redis_limiter import RedisLimiterStore

    assert settings.limits_url is not None
    store = await RedisLimiterStore.connect(
        settings.limits_url.get_secret_value(), settings.limits_timeout_s
    )
    closers: list[Callable[[], Awaitable[None]]] = [store.close]
    if keys is not None:
        client = store.client

        async def publish(key_id: str) -> None:
            await publish_key_change(client, key_id)

        keys.on_change = publish
        listener = KeyChangeListener(client, keys)
        await listener.start()
        closers.append(listener.close)
    return store, closers
