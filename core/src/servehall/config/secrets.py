"""Secret values in config: literal, ``{ env = "NAME" }`` or ``{ file = "/path" }``.

Resolved at load time into :class:`pydantic.SecretStr`, so they print as ``**********``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any

from pydantic import BeforeValidator, SecretStr


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
        raise ValueError('a secret is a string, { env = "NAME" } or { file = "/path" }')
    return value


Secret = Annotated[SecretStr, BeforeValidator(resolve_secret)]
"""A config field type for secrets."""
