"""Token-aware rate limits: reserve at admission, settle at the end, release on rejection.

Per principal (API key or JWT subject) and, when ``[auth.tenants.<name>]`` sets them,
per tenant: a requests-per-minute bucket and a tokens-per-minute bucket. Admission
reserves 1 request and ``prompt_tokens + max_tokens × n`` tokens in every bucket at
once (all or nothing, so a rejected request consumes nothing). When the request ends,
:meth:`TokenReservation.settle` refunds the difference between the estimate and the
real usage; when the host rejects it later (queue full, timeout, filter),
:meth:`TokenReservation.release` gives everything back.

Headers follow OpenAI's names: ``x-ratelimit-limit-requests``,
``x-ratelimit-limit-tokens``, ``x-ratelimit-remaining-requests``,
``x-ratelimit-remaining-tokens``, ``x-ratelimit-reset-requests``,
``x-ratelimit-reset-tokens`` (durations like ``1s``, ``6m0s``, ``250ms``: time until
the bucket is full again). For each kind, the most restrictive bucket (key or tenant)
is reported. Every 429 adds ``Retry-After`` (whole seconds, at least 1): the time until
the buckets have room, or — for ``tokens_exceed_limit``, a request whose estimate is
larger than a tokens bucket and so can never fit — the full 60 s window.

With a shared store (``[auth] limits_url``, :mod:`servehall_auth.redis_limiter`), a
store that cannot be reached at admission gives ``limits_on_error = "closed"``: 503
``rate_limiter_unavailable`` with ``Retry-After`` (the default), or ``"open"``: the
request is admitted without limits. A settle or release that fails is logged and
counted; nothing is retried (the bucket refills by itself within its minute). Every
failure increments ``servehall_auth_limiter_errors_total`` and is logged as a warning
(at most once per 5 s); the first success afterwards logs that the store is back.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from typing import Literal

from servehall import AdmissionRequest, Principal, RateLimitError, ServiceUnavailableError
from servehall_auth.limiter import Bucket, LimiterStore
from servehall_auth.metrics import LIMITER_ERRORS
from servehall_auth.redis_limiter import LimiterUnavailableError
from servehall_auth.settings import AuthSettings

log = logging.getLogger("servehall_auth")

UNAVAILABLE_CODE = "rate_limiter_unavailable"
"""``error.code`` of the fail-closed 503 when the shared limiter store is unreachable."""

Kind = Literal["requests", "tokens"]


def format_duration(seconds: float) -> str:
    """OpenAI-style duration: ``250ms``, ``1s``, ``1.5s``, ``6m0s``, ``1h2m3s``."""
    seconds = max(0.0, seconds)
    if seconds < 1:
        return f"{math.ceil(seconds * 1000)}ms"
    if seconds < 60:
        text = f"{seconds:.3f}".rstrip("0").rstrip(".")
        return f"{text}s"
    total = math.ceil(seconds)
    h, rem = divmod(total, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h{m}m{s}s" if h else f"{m}m{s}s"


@dataclass(frozen=True, slots=True)
class _Limit:
    bucket: Bucket
    kind: Kind


class StoreHealth:
    """Logs and counts failures of the limiter store (one warning per 5 s at most, and
    one line when it answers again)."""

    def __init__(self) -> None:
        self.failing = False
        self._last_warn = -1e9

    def failed(self, operation: str, outcome: str, exc: LimiterUnavailableError) -> None:
        """Count one failure of ``operation`` and log it (rate-limited)."""
        LIMITER_ERRORS.labels(operation, outcome).inc()
        self.failing = True
        now = time.monotonic()
        if now - self._last_warn >= 5.0:
            self._last_warn = now
            log.warning("auth: rate-limit store unreachable (%s); %s %s", exc, operation, outcome)

    def ok(self) -> None:
        """Note a successful call (logs recovery once)."""
        if self.failing:
            self.failing = False
            self._last_warn = -1e9
            log.warning("auth: rate-limit store reachable again")


class RateLimiter:
    """Builds buckets for a principal and reserves quota in a :class:`LimiterStore`."""

    def __init__(self, store: LimiterStore, settings: AuthSettings) -> None:
        self.store = store
        self.settings = settings
        self.health = StoreHealth()

    def limits_for(self, principal: Principal) -> list[_Limit]:
        """Buckets that apply to ``principal`` (empty when it is unlimited)."""
        out: list[_Limit] = []
        rpm = principal.policy.limits.rpm or self.settings.default_rpm
        tpm = principal.policy.limits.tpm or self.settings.default_tpm
        if rpm:
            out.append(_Limit(Bucket(f"p:{principal.id}:requests", float(rpm)), "requests"))
        if tpm:
            out.append(_Limit(Bucket(f"p:{principal.id}:tokens", float(tpm)), "tokens"))
        tenant = self.settings.tenants.get(principal.tenant or "") if principal.tenant else None
        if tenant is not None:
            if tenant.rpm:
                out.append(
                    _Limit(Bucket(f"t:{principal.tenant}:requests", float(tenant.rpm)), "requests")
                )
            if tenant.tpm:
                out.append(
                    _Limit(Bucket(f"t:{principal.tenant}:tokens", float(tenant.tpm)), "tokens")
                )
        return out

    async def reserve(self, request: AdmissionRequest) -> TokenReservation | None:
        """Reserve quota for ``request``; None when no limit applies.

        Raises:
            RateLimitError: a bucket lacks room (429 with ``Retry-After`` and
                ``x-ratelimit-*`` headers); nothing was debited.
            ServiceUnavailableError: the shared store is unreachable and
                ``limits_on_error = "closed"`` (503 ``rate_limiter_unavailable`` with
                ``Retry-After``).
        """
        limits = self.limits_for(request.principal)
        if not limits:
            return None
        tokens = float(request.token_estimate)
        charges = [(lim.bucket, 1.0 if lim.kind == "requests" else tokens) for lim in limits]
        try:
            result = await self.store.acquire(charges)
        except LimiterUnavailableError as exc:
            if self.settings.limits_on_error == "open":
                self.health.failed("acquire", "admitted", exc)
                return None
            self.health.failed("acquire", "rejected", exc)
            raise ServiceUnavailableError(
                "Rate limits cannot be checked right now (the shared limit store is "
                "unreachable); retry later.",
                code=UNAVAILABLE_CODE,
                headers={"Retry-After": str(self.settings.limits_retry_after_s)},
            ) from None
        self.health.ok()
        headers = _headers(limits, result.levels)
        if not result.ok:
            if math.isinf(result.retry_after_s):
                # the estimate exceeds a tokens bucket's capacity: it can never fit. Like
                # OpenAI, still a 429 with the rate-limit headers; Retry-After is the full
                # window (the time an empty bucket takes to refill), as for any per-key 429.
                tight = [lim.bucket for lim in limits if lim.kind == "tokens"]
                cap = min(b.capacity for b in tight)
                window = max(b.capacity / b.refill_per_s for b in tight)
                headers["Retry-After"] = str(max(1, math.ceil(window)))
                raise RateLimitError(
                    f"This request may use up to {int(tokens)} tokens (prompt + max_tokens × n), "
                    f"more than the limit of {int(cap)} tokens per minute; lower max_tokens.",
                    code="tokens_exceed_limit",
                    headers=headers,
                )
            headers["Retry-After"] = str(max(1, math.ceil(result.retry_after_s)))
            raise RateLimitError(
                f"Rate limit reached for {request.principal.id}; retry after "
                f"{headers['Retry-After']} s.",
                headers=headers,
            )
        return TokenReservation(self.store, limits, tokens, headers, self.health)


def _headers(limits: list[_Limit], levels: dict[str, float]) -> dict[str, str]:
    out: dict[str, str] = {}
    for kind in ("requests", "tokens"):
        chosen = [lim for lim in limits if lim.kind == kind]
        if not chosen:
            continue
        tight = min(chosen, key=lambda lim: levels.get(lim.bucket.key, lim.bucket.capacity))
        b = tight.bucket
        level = levels.get(b.key, b.capacity)
        out[f"x-ratelimit-limit-{kind}"] = str(int(b.capacity))
        out[f"x-ratelimit-remaining-{kind}"] = str(max(0, math.floor(level)))
        out[f"x-ratelimit-reset-{kind}"] = format_duration((b.capacity - level) / b.refill_per_s)
    return out


class TokenReservation:
    """Quota held for one request (implements :class:`servehall.Reservation`).

    Exactly one of :meth:`settle` / :meth:`release` takes effect; later calls are no-ops.
    """

    def __init__(
        self,
        store: LimiterStore,
        limits: list[_Limit],
        tokens: float,
        headers: dict[str, str],
        health: StoreHealth | None = None,
    ) -> None:
        self._store = store
        self._limits = limits
        self.reserved_tokens = tokens
        self._headers = headers
        self._health = health or StoreHealth()
        self._done = False

    async def _credit(self, operation: str, charges: list[tuple[Bucket, float]]) -> None:
        try:
            await self._store.credit(charges)
        except LimiterUnavailableError as exc:
            self._health.failed(operation, "lost", exc)

    async def settle(self, prompt_tokens: int, completion_tokens: int) -> None:
        """Charge the real usage: refund ``estimate − (prompt + completion)`` tokens
        (a negative refund, if a backend overran ``max_tokens``, charges the excess)."""
        if self._done:
            return
        self._done = True
        refund = self.reserved_tokens - float(prompt_tokens + completion_tokens)
        if refund:
            await self._credit(
                "settle", [(lim.bucket, refund) for lim in self._limits if lim.kind == "tokens"]
            )

    async def release(self) -> None:
        """The request was rejected after admission: give back the request and tokens."""
        if self._done:
            return
        self._done = True
        await self._credit(
            "release",
            [
                (lim.bucket, 1.0 if lim.kind == "requests" else self.reserved_tokens)
                for lim in self._limits
            ],
        )

    def headers(self) -> dict[str, str]:
        """``x-ratelimit-*`` headers as of admission."""
        return dict(self._headers)
