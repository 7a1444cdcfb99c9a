"""Process logging for ``servehall serve``.

Some libraries below the host log request data at DEBUG: ``hpack`` logs every decoded
HTTP/2 header (``Authorization`` included) and ``aiosqlite`` logs every SQL statement
with its parameters (stored prompts included). Their DEBUG output is per-header or
per-row noise that carries secrets and nothing an operator needs, so the host caps them
at INFO whatever ``[server] log_level`` says (case C17: no secret in any log at any level).
"""

from __future__ import annotations

import logging

NOISY_LOGGERS: tuple[str, ...] = ("hpack", "aiosqlite")
"""Loggers never allowed below INFO."""

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def configure_logging(level: str) -> None:
    """Configure the root logger at ``level`` (``"debug"``, ``"info"``, …) and cap the
    loggers of :data:`NOISY_LOGGERS` at INFO; servehall's own loggers follow the root
    (a level set on ``servehall`` earlier in the process, e.g. by the bench's logging,
    is cleared). Raises ValueError for an unknown level."""
    logging.basicConfig(format=LOG_FORMAT)  # adds a handler only when none exists
    logging.getLogger().setLevel(level.upper())
    logging.getLogger("servehall").setLevel(logging.NOTSET)
    logging.captureWarnings(True)  # library warnings get a timestamp like every line
    for name in NOISY_LOGGERS:
        logger = logging.getLogger(name)
        if logger.getEffectiveLevel() < logging.INFO:
            logger.setLevel(logging.INFO)
