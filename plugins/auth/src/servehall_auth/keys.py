"""API key format, generation and hashing.

A key looks like ``sh-<key_id>-<secret>``:

* ``key_id`` — 10 lowercase base32 characters (50 bits), public: logs, audit events,
  the request log and ``keys list`` name a key by ``sh-<key_id>``, which is also the
  first characters of the key its holder sees;
* ``secret`` — 43 characters of the URL-safe alphabet without ``-`` (256 bits from
  :func:`secrets.token_bytes`).

Only ``HMAC-SHA-256(pepper, key)`` (hex) is stored. The pepper is a server-side secret
from config, so a copy of the database alone does not allow an offline guess check; the
key's 256 bits of entropy make a slow KDF unnecessary. Hashes are compared with
:func:`hmac.compare_digest`.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass

KEY_PREFIX = "sh-"
_KEY_ID_LEN = 10
_SECRET_LEN = 43
_KEY_RE = re.compile(r"^sh-([a-z2-7]{10})-([A-Za-z0-9_]{43})$")


@dataclass(frozen=True, slots=True)
class ParsedKey:
    """A syntactically valid key split into its public id and the whole key text."""

    key_id: str
    key: str

    @property
    def public_id(self) -> str:
        """``sh-<key_id>``: the non-secret name of the key (safe to log)."""
        return public_id(self.key_id)


def public_id(key_id: str) -> str:
    """``sh-<key_id>``, the form used as principal id and in logs."""
    return f"{KEY_PREFIX}{key_id}"


def new_key_id() -> str:
    """A fresh random key id (10 lowercase base32 characters)."""
    return base64.b32encode(secrets.token_bytes(10)).decode("ascii").lower()[:_KEY_ID_LEN]


def new_secret() -> str:
    """A fresh 256-bit secret: 43 characters of ``[A-Za-z0-9_]``."""
    raw = base64.urlsafe_b64encode(secrets.token_bytes(32)).decode("ascii").rstrip("=")
    # '-' is the field separator of the key format; map it into the alphabet.
    return raw.replace("-", "_")[:_SECRET_LEN]


def format_key(key_id: str, secret: str) -> str:
    """The full key text handed to its holder once."""
    return f"{KEY_PREFIX}{key_id}-{secret}"


def looks_like_key(token: str) -> bool:
    """True when ``token`` starts like a servehall key (it may still be malformed)."""
    return token.startswith(KEY_PREFIX)


def parse_key(token: str) -> ParsedKey | None:
    """Split a key into id and text; None when it is not a well-formed servehall key."""
    m = _KEY_RE.match(token)
    if m is None:
        return None
    return ParsedKey(key_id=m.group(1), key=token)


def hash_key(key: str, pepper: str) -> str:
    """``HMAC-SHA-256(pepper, key)`` as 64 hex characters — the only form stored."""
    return hmac.new(pepper.encode("utf-8"), key.encode("utf-8"), hashlib.sha256).hexdigest()


PEPPER_FINGERPRINT_LABEL = b"servehall-auth pepper fingerprint v1"


def pepper_fingerprint(pepper: str) -> str:
    """16 hex characters that identify a pepper without revealing it:
    ``HMAC-SHA-256(pepper, "servehall-auth pepper fingerprint v1")[:16]``. Stored with
    each key (``api_key.pepper_fp``) so the server can tell at start whether the
    configured pepper is the one the keys were made with."""
    return hmac.new(pepper.encode("utf-8"), PEPPER_FINGERPRINT_LABEL, hashlib.sha256).hexdigest()[
        :16
    ]


def verify_key(key: str, pepper: str, stored_hash: str | None) -> bool:
    """Constant-time check of ``key`` against a stored hash (False when none stored)."""
    if not stored_hash:
        return False
    return hmac.compare_digest(hash_key(key, pepper), stored_hash)
