"""Authentication: header → credential → principal (API key or JWT).

A token that starts with ``sh-`` is an API key; a token with three dot-separated parts
is a JWT (only when ``[auth.jwt]`` is configured); anything else is rejected. Every
rejection raises :class:`servehall.AuthenticationError` (401 with
``WWW-Authenticate: Bearer``) and is reported to the :class:`FailureAuditor`.
"""

from __future__ import annotations

import logging
from typing import Any

from sqlalchemy.exc import SQLAlchemyError

from servehall import AuthenticationError, Principal, ServiceUnavailableError
from servehall_auth.audit import FailureAuditor
from servehall_auth.headers import extract_credential
from servehall_auth.jwt_verify import JwtVerifier
from servehall_auth.keys import looks_like_key, parse_key, public_id
from servehall_auth.settings import AuthSettings
from servehall_auth.store import KeyStore

log = logging.getLogger("servehall_auth")

_MESSAGES = {
    "malformed_key": "The API key is malformed.",
    "unknown_key": "Invalid API key.",
    "bad_secret": "Invalid API key.",
    "revoked": "This API key has been revoked.",
    "expired": "This API key has expired.",
}


class Authenticator:
    """Turns request headers into a :class:`servehall.Principal`.

    Args:
        settings: the validated ``[auth]`` section.
        keys: the key store (None when ``api_keys = false``).
        jwt: the JWT verifier (None without ``[auth.jwt]``).
        auditor: where failures go.
    """

    def __init__(
        self,
        settings: AuthSettings,
        keys: KeyStore | None,
        jwt: JwtVerifier | None,
        auditor: FailureAuditor,
    ) -> None:
        self.settings = settings
        self.keys = keys
        self.jwt = jwt
        self.auditor = auditor

    async def authenticate(
        self,
        authorization: list[str],
        x_api_key: list[str],
        *,
        path: str = "",
        client: str | None = None,
    ) -> Principal | None:
        """The principal for these header values; None when no credential was sent.

        Raises:
            AuthenticationError: a credential is present but malformed or not valid.
        """
        where: dict[str, Any] = {"path": path, "client": client}
        try:
            cred = extract_credential(authorization, x_api_key, self.settings.header_precedence)
        except AuthenticationError as exc:
            self.auditor.failure("malformed_header", **where)
            raise exc
        if cred is None:
            return None
        token = cred.token
        if looks_like_key(token):
            return await self._api_key(token, where)
        if cred.source == "authorization" and token.count(".") == 2 and self.jwt is not None:
            try:
                return self.jwt.verify(token)
            except AuthenticationError as exc:
                self.auditor.failure(f"jwt:{exc.code}", detail=exc.message, **where)
                raise
        self.auditor.failure("unrecognised_credential", source=cred.source, **where)
        raise AuthenticationError("Invalid API key.")

    async def _api_key(self, token: str, where: dict[str, Any]) -> Principal:
        if self.keys is None:
            self.auditor.failure("api_keys_disabled", **where)
            raise AuthenticationError("API keys are not accepted here.")
        parsed = parse_key(token)
        if parsed is None:
            self.auditor.failure("malformed_key", **where)
            raise AuthenticationError(_MESSAGES["malformed_key"])
        try:
            outcome, record = await self.keys.verify(parsed.key_id, parsed.key)
        except (SQLAlchemyError, OSError, TimeoutError) as exc:
            # The key store is unreachable or hung (no answer within [database]
            # command_timeout_s): not the caller's fault, so not a 401; fail closed.
            log.warning("API key lookup failed: %s", type(exc).__name__)
            raise ServiceUnavailableError(
                "Authentication is temporarily unavailable; retry later.",
                code="auth_unavailable",
                headers={"Retry-After": "1"},
            ) from None
        if outcome in ("ok", "ok_previous") and record is not None:
            return record.principal()
        self.auditor.failure(outcome, target=public_id(parsed.key_id), **where)
        raise AuthenticationError(_MESSAGES.get(outcome, "Invalid API key."))
