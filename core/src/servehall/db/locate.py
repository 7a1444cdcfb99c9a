"""Which database a command uses, and refusing one that does not exist.

SQLite creates a database file on first connect, so a CLI command run in the wrong
directory or without the server's ``--config`` would silently create (and then inspect)
an empty ``servehall.db``. Commands call :func:`require_existing_database` first (only
``servehall db upgrade`` may create one) and name the database they used with
:func:`describe_database`.
"""

from __future__ import annotations

import os
from pathlib import Path

from sqlalchemy.engine import make_url

from servehall.db.engine import safe_url
from servehall.errors import ConfigError


def sqlite_path(url: str) -> Path | None:
    """The absolute file path of a SQLite URL (relative paths resolve against the working
    directory, as SQLite does); None for other databases and in-memory SQLite."""
    try:
        parsed = make_url(url)
    except Exception:
        return None
    if not parsed.drivername.startswith("sqlite"):
        return None
    db = parsed.database or ""
    if db in ("", ":memory:") or db.startswith("file:"):
        return None
    return Path(os.path.abspath(Path(db).expanduser()))


def describe_database(url: str) -> str:
    """``url`` for messages: the password masked, a SQLite path made absolute."""
    path = sqlite_path(url)
    if path is not None:
        return f"{make_url(url).drivername}:///{path}"
    return safe_url(url)


def config_source(config: Path | str | None) -> str:
    """Where the settings came from: ``--config FILE``, ``$SERVEHALL_CONFIG``, or defaults."""
    if config is not None:
        return f"config {config}"
    env = os.environ.get("SERVEHALL_CONFIG")
    if env:
        return f"config {env} ($SERVEHALL_CONFIG)"
    return "no --config: built-in defaults"


def require_existing_database(url: str, *, config: Path | str | None = None) -> None:
    """Refuse a SQLite database file that does not exist (a connect would create it).

    Raises:
        ConfigError: one line naming the absolute path, where the URL came from, and the
            two ways out (the server's ``--config``, or ``servehall db upgrade``).
    """
    path = sqlite_path(url)
    if path is None or path.exists():
        return
    raise ConfigError(
        f"database {describe_database(url)} does not exist ({config_source(config)}); "
        "pass the --config the server uses, or create it with `servehall db upgrade`"
    )
