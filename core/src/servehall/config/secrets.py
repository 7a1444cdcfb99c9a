"""Secret values in config: literal, ``{ env = "NAME" }`` or ``{ file = "/path" }``.

Resolved at load time into :class:`pydantic.SecretStr`, so they print as ``**********``.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Annotated, Any

from pydantic import BeforeValidator, SecretStr

MASK = "**********"
"""How a secret is shown (``config show``, audit details)."""

SECRET_NAME = re.compile(
    r"(^|[_\-.])(secret|secrets|password|passwd|api_?key|apikey|key|authorization|bearer"
    r"|credentials?|private_?key|token|access_token|refresh_token|cookie)$",
    re.IGNORECASE,
)
"""Names (keys) whose values are secrets where no type says so: free-form tables such as
``[[models]] options`` (:mod:`servehall.config.redact`) and audit details
(:func:`servehall.records.codec.redact`). Typed settings mark secrets with :data:`Secret`."""


URL_PASSWORD = re.compile(r"(://[^/:@\s]*:)([^@/\s]+)(@)")
"""The password of a URL (``scheme://user:password@host``): group 2."""


def is_secret_name(name: object) -> bool:
    """True when the key ``name`` looks like it holds a secret (:data:`SECRET_NAME`)."""
    return isinstance(name, str) and SECRET_NAME.search(name) is not None


def resolve_secret(value: Any) -> Any:
    """Turn ``{"env": NAME}`` / ``{"file": PATH}`` into the secret's text.

    Raises ValueError (reported with its key path) when the variable is unset or the file
    cannot be read. Other values pass through unchanged.
    """
    if isinstance(value, dict):
        if set(value) == {"env"}:
            name = str(value["env"])
            if name not in os.environ:
                raise ValueError(f"environment variable {name} is not set")
            return os.environ[name]
        if set(value) == {"file"}:
            path = Path(str(value["file"])).expanduser()
            try:
                return path.read_text(encoding="utf-8").strip()
            except OSError as exc:
                raise ValueError(f"cannot read secret file {path}: {exc.strerror}") from None
        if set(value) == {"redacted"}:
            raise ValueError(
                "this secret was redacted from a stored config revision: write the secret, "
                '{ env = "NAME" } or { file = "/path" } here'
            )
        raise ValueError('a secret is a string, { env = "NAME" } or { file = "/path" }')
    return value


Secret = Annotated[SecretStr, BeforeValidator(resolve_secret)]
"""A config field type for secrets."""


def resolve_secret_reference(value: Any) -> Any:
    """Like :func:`resolve_secret`, but refuse a literal value.

    For keys that must never be written into the config text (which is kept in
    ``config_revision``): only ``{ env = "NAME" }`` or ``{ file = "/path" }``.

    Raises:
        ValueError: a literal string, or what :func:`resolve_secret` raises.
    """
    if value is not None and not isinstance(value, dict):
        raise ValueError(
            'give a reference, { env = "NAME" } or { file = "/path" }, never the key itself'
        )
    return resolve_secret(value)


SecretReference = Annotated[SecretStr, BeforeValidator(resolve_secret_reference)]
"""A config field type for secrets that must be references (env variable or file)."""
