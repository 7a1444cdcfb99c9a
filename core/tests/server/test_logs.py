"""Process logging: libraries that log raw headers or SQL parameters stay at INFO (C17)."""

from __future__ import annotations

import io
import logging

from servehall.server.logs import NOISY_LOGGERS, configure_logging


def test_debug_level_never_lets_header_dumps_through() -> None:
    root = logging.getLogger()
    buf = io.StringIO()
    handler = logging.StreamHandler(buf)
    own = logging.getLogger("servehall")
    old = (root.level, {n: logging.getLogger(n).level for n in NOISY_LOGGERS}, own.level)
    root.addHandler(handler)
    try:
        own.setLevel(logging.INFO)  # as the bench's logging leaves it in the same process
        configure_logging("debug")
        assert root.getEffectiveLevel() == logging.DEBUG
        logging.getLogger("hpack.hpack").debug("Decoded (b'authorization', b'Bearer canary')")
        logging.getLogger("aiosqlite").debug("executing INSERT ... ('secret prompt',)")
        logging.getLogger("servehall.test").debug("ordinary debug line")
        text = buf.getvalue()
        assert "canary" not in text and "secret prompt" not in text
        assert "ordinary debug line" in text
        assert all(logging.getLogger(n).getEffectiveLevel() >= logging.INFO for n in NOISY_LOGGERS)
    finally:
        root.removeHandler(handler)
        root.setLevel(old[0])
        own.setLevel(old[2])
        for name, level in old[1].items():
            logging.getLogger(name).setLevel(level)
