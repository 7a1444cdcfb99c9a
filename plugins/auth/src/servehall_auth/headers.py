"""Reading the credential from request headers.

Accepted forms:

* ``Authorization: Bearer <token>`` — the scheme name is case-insensitive (RFC 9110
  §11.1), separated from the token by exactly one space; the token is an API key or a
  JWT and must be a ``token68`` (RFC 9110 §11.2);
* ``x-api-key: <key>`` — an API key only.

Precedence when both headers are present is configured by ``[auth]
header_precedence``: ``"authorization"`` (default) uses ``Authorization`` and ignores
``x-api-key``; ``"x-api-key"`` the reverse. The chosen header decides alone — a bad
chosen header is a 401 even if the other one would have been good.

Everything else (another scheme such as ``Basic``, ``Bearer`` with no token, two spaces,
several ``Authorization`` headers, characters outside token68) raises
:class:`servehall.AuthenticationError` → 401 with ``WWW-Authenticate: Bearer``.
Messages never quote the credential.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from servehall import AuthenticationError

_TOKEN68 = re.compile(r"^[A-Za-z0-9\-._~+/]+=*$")
_MAX_CREDENTIAL_LEN = 8192


@dataclass(frozen=True, slots=True)
class Credential:
    """A credential taken from a header.

    Attributes:
        token: the secret text (API key or JWT) — never log it.
        source: ``"authorization"`` or ``"x-api-key"``.
    """

    token: str
    source: Literal["authorization", "x-api-key"]

    def __repr__(self) -> str:  # keep the secret out of tracebacks and debug logs
        return f"Credential(source={self.source!r}, token=<redacted>)"


def _check_token(token: str, where: str) -> str:
    if not token:
        raise AuthenticationError(f"The {where} header carries no credential.")
    if len(token) > _MAX_CREDENTIAL_LEN:
        raise AuthenticationError(f"The {where} credential is too long.")
    if not _TOKEN68.match(token):
        raise AuthenticationError(f"The {where} credential has characters not allowed there.")
    return token


def parse_authorization(value: str) -> str:
    """The token of an ``Authorization: Bearer <token>`` value.

    Raises:
        AuthenticationError: any other scheme or a malformed value.
    """
    scheme, sep, rest = value.partition(" ")
    if scheme.lower() != "bearer":
        raise AuthenticationError(
            "Unsupported authorization scheme; use 'Authorization: Bearer <key>'."
        )
    if not sep or not rest:
        raise AuthenticationError("The Authorization header has 'Bearer' but no credential.")
    if rest.startswith(" ") or rest != rest.strip():
        raise AuthenticationError(
            "Malformed Authorization header; use exactly one space after 'Bearer'."
        )
    return _check_token(rest, "Authorization")


def extract_credential(
    authorization: Sequence[str],
    x_api_key: Sequence[str],
    precedence: Literal["authorization", "x-api-key"] = "authorization",
) -> Credential | None:
    """The credential of a request from its header values, or None when it has none.

    Args:
        authorization: every ``Authorization`` header value (usually 0 or 1).
        x_api_key: every ``x-api-key`` header value.
        precedence: which header wins when both are present.

    Raises:
        AuthenticationError: the chosen header is repeated or malformed.
    """
    order: list[Literal["authorization", "x-api-key"]] = (
        ["authorization", "x-api-key"]
        if precedence == "authorization"
        else ["x-api-key", "authorization"]
    )
    values = {"authorization": authorization, "x-api-key": x_api_key}
    for source in order:
        got = values[source]
        if not got:
            continue
        if len(got) > 1:
            raise AuthenticationError(f"Several {source} headers; send exactly one.")
        if source == "authorization":
            return Credential(parse_authorization(got[0]), "authorization")
        return Credential(_check_token(got[0].strip(), "x-api-key"), "x-api-key")
    return None
