"""Async engines for the deployment database (SQLite with WAL, or PostgreSQL).

URLs: ``sqlite+aiosqlite:///path.db`` (relative to the working directory) and
``postgresql+asyncpg://user:password@host:port/db``. The URL is a secret in config
(it may carry a password) and is never logged; :func:`safe_url` renders it masked.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sqlalchemy import event
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from servehall.errors import ConfigError

if TYPE_CHECKING:
    from servehall.config.settings import Settings

SUPPORTED_DRIVERS = ("sqlite+aiosqlite", "postgresql+asyncpg")


@dataclass(frozen=True, slots=True)
class DbTimeouts:
    """Bounds on a PostgreSQL session, in seconds (0 = no limit); see ``[database]``.

    ``command_s`` bounds each statement on the client (asyncpg ``command_timeout``,
    also the connect timeout) and on the server (``statement_timeout``); ``lock_s`` is
    the server's ``lock_timeout``; ``idle_in_transaction_s`` its
    ``idle_in_transaction_session_timeout``. SQLite ignores them (its busy timeout is
    10 s).
    """

    command_s: float = 30.0
    lock_s: float = 10.0
    idle_in_transaction_s: float = 30.0

    @classmethod
    def of(cls, settings: Settings) -> DbTimeouts:
        """The timeouts of ``[database]``."""
        db = settings.database
        return cls(db.command_timeout_s, db.lock_timeout_s, db.idle_in_transaction_timeout_s)

    def connect_args(self) -> dict[str, Any]:
        """asyncpg ``connect()`` arguments that apply these bounds."""
        server = {
            "statement_timeout": self.command_s,
            "lock_timeout": self.lock_s,
            "idle_in_transaction_session_timeout": self.idle_in_transaction_s,
        }
        args: dict[str, Any] = {
            "server_settings": {k: str(int(v * 1000)) for k, v in server.items() if v > 0}
        }
        if self.command_s > 0:
            args["command_timeout"] = self.command_s
            args["timeout"] = self.command_s
        return args


def database_url(settings: Settings) -> str:
    """The configured ``[database] url`` as plain text (it is a secret: don't log it)."""
    return settings.database.url.get_secret_value()


def safe_url(url: str) -> str:
    """``url`` with any password replaced by ``***`` (for messages and logs)."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:
        return "<unparseable database url>"


def sqlite_pragmas(dbapi_conn: Any, _record: Any = None) -> None:
    """Set servehall's SQLite pragmas on a DBAPI connection (WAL, ``synchronous =
    NORMAL``, a 10 s busy timeout, foreign keys); also a ``connect`` event listener."""
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.execute("PRAGMA busy_timeout=10000")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.close()


def create_db_engine(
    url_or_settings: str | Settings, *, timeouts: DbTimeouts | None = None, **kwargs: Any
) -> AsyncEngine:
    """Create an :class:`~sqlalchemy.ext.asyncio.AsyncEngine` for the deployment database.

    Args:
        url_or_settings: a URL, or the :class:`~servehall.Settings` whose
            ``[database] url`` to use.
        timeouts: bounds on PostgreSQL sessions; default: those of the settings when
            settings are given, none for a bare URL (migrations and tools).
        kwargs: extra ``create_async_engine`` arguments.

    SQLite connections run with ``journal_mode=WAL``, ``synchronous=NORMAL`` and a 10 s
    busy timeout; PostgreSQL connections are pre-pinged so a restarted server is
    reconnected transparently.

    Raises:
        ConfigError: the URL does not parse or names an unsupported driver.
    """
    url = url_or_settings if isinstance(url_or_settings, str) else database_url(url_or_settings)
    try:
        parsed = make_url(url)
    except Exception:
        raise ConfigError("database.url: not a valid SQLAlchemy URL") from None
    if parsed.drivername not in SUPPORTED_DRIVERS:
        raise ConfigError(
            f"database.url: driver {parsed.drivername!r} is not supported; use "
            + " or ".join(f"{d}://..." for d in SUPPORTED_DRIVERS)
        )
    if parsed.drivername.startswith("sqlite"):
        engine = create_async_engine(parsed, **kwargs)
        event.listen(engine.sync_engine, "connect", sqlite_pragmas)
        return engine
    if timeouts is None and not isinstance(url_or_settings, str):
        timeouts = DbTimeouts.of(url_or_settings)
    if timeouts is not None:
        kwargs["connect_args"] = {**timeouts.connect_args(), **kwargs.get("connect_args", {})}
    kwargs.setdefault("pool_pre_ping", True)
    kwargs.setdefault("pool_size", 4)
    kwargs.setdefault("max_overflow", 4)
    return create_async_engine(parsed, **kwargs)
