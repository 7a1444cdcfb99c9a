"""Keep credentials out of the process's logs, at every level (case C17).

The host already caps the libraries that log raw headers at DEBUG (``servehall.server.logs``).
While the auth plugin runs it also adds :class:`RedactingFilter` to every handler of the
root logger, which rewrites any record whose text contains a servehall key, a bearer
credential, a JWT-shaped token or the configured pepper, replacing the secret part with
``***`` (the public key id ``sh-<id>`` stays, so a log line still names the key).

:func:`install` returns an undo function (used at shutdown).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable

_PATTERNS: tuple[tuple[re.Pattern[str], str], ...] = (
    # servehall keys, also truncated or with extra characters: keep sh-<id>
    (re.compile(r"(sh-[A-Za-z0-9]{1,32})-[A-Za-z0-9_\-]{4,}"), r"\1-***"),
    # bearer values (quoted or bytes reprs included); servehall keys keep their id above.
    # Other schemes are not redacted by name ("basic", "token" are common words); a
    # servehall key or JWT sent under them is still caught by the other patterns.
    (
        re.compile(r"(?i)\b(bearer)(\s+|'\s*,\s*b?')(?!sh-)[A-Za-z0-9\-._~+/=]{4,}"),
        r"\1\2***",
    ),
    # JWT-shaped tokens: base64url header.payload.signature
    (re.compile(r"eyJ[A-Za-z0-9_\-]+\.[A-Za-z0-9_\-]*\.[A-Za-z0-9_\-]*"), "***jwt***"),
)


def redact(text: str, literals: Iterable[str] = ()) -> str:
    """``text`` with credentials and the given literal secrets replaced by ``***``."""
    for pattern, repl in _PATTERNS:
        text = pattern.sub(repl, text)
    for lit in literals:
        if lit:
            text = text.replace(lit, "***")
    return text


class RedactingFilter(logging.Filter):
    """A handler filter that redacts secrets from each record's final message.

    Args:
        literals: exact secrets to remove as well (e.g. the pepper).
    """

    def __init__(self, literals: Iterable[str] = ()) -> None:
        super().__init__("servehall_auth.redaction")
        self.literals = tuple(s for s in literals if s)

    def filter(self, record: logging.LogRecord) -> bool:
        """Rewrite the record in place when it holds a secret; never drops a record."""
        try:
            message = record.getMessage()
        except Exception:
            return True
        cleaned = redact(message, self.literals)
        if record.exc_text:
            record.exc_text = redact(record.exc_text, self.literals)
        if cleaned != message:
            record.msg = cleaned
            record.args = None
        return True


def install(literals: Iterable[str] = ()) -> Callable[[], None]:
    """Attach the filter to the root logger's handlers; returns the undo function."""
    filt = RedactingFilter(literals)
    root = logging.getLogger()
    handlers = list(root.handlers)
    for h in handlers:
        h.addFilter(filt)

    def undo() -> None:
        for h in handlers:
            h.removeFilter(filt)

    return undo
