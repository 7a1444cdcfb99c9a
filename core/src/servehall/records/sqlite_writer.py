"""Request-log rows into a SQLite file in one thread hop per batch.

The ``sql`` sink writes through SQLAlchemy's async engine; on SQLite that engine runs the
``aiosqlite`` driver, which makes every DBAPI call (pool checkout, ``BEGIN``, the
``executemany``, ``COMMIT``, cursor close, checkin) its own round trip between the event
loop and aiosqlite's thread. Measured on the project's 2-core machine
(docs/performance.md, "The API process's per-token path"): one transaction of one
``request_log`` row cost 1.0–1.5 ms of the API process's CPU that way, against 0.29 ms for
the same statement with the standard library's :mod:`sqlite3` on one dedicated thread,
one hop for the whole transaction — at low load each request's record is its own
transaction, so this is CPU taken from every request.

:class:`SqliteRowWriter` is that one hop: a :mod:`sqlite3` connection owned by one thread
(:func:`servehall.db.engine.sqlite_pragmas`, as for the SQLAlchemy engine: WAL,
``synchronous = NORMAL``, a 10 s busy timeout), ``BEGIN IMMEDIATE`` → ``executemany`` →
``COMMIT``. The sink uses it only for batches of request rows on a plain SQLite file;
audit events, the checkpoints and the health probe keep the SQLAlchemy path (one
transaction with the audit chain's head). A failed batch is rolled back and the
connection is reopened for the next attempt (the sink's runner retries; ``ON CONFLICT DO
NOTHING`` keeps a retried batch from duplicating rows).
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from sqlalchemy.engine import make_url

from servehall.db.engine import sqlite_pragmas

BAD_DATA_ERRORS: tuple[type[Exception], ...] = (sqlite3.IntegrityError, sqlite3.DataError)
""":mod:`sqlite3` errors caused by a row's content: the connection is kept for the next
attempt (after any other error it is reopened)."""

SUSPECT_ERRORS: tuple[type[Exception], ...] = (
    *BAD_DATA_ERRORS,
    sqlite3.ProgrammingError,
    sqlite3.InterfaceError,
)
""":mod:`sqlite3` errors that may come from a row's content (a value it cannot bind is a
``ProgrammingError``): the runner then writes the batch record by record and
quarantines a record the database refuses while it takes a known-good one."""


def sqlite_file(url: str) -> str | None:
    """The file path of a ``sqlite+aiosqlite`` URL that names a plain file, else None.

    None for other drivers, in-memory databases (each connection would see its own),
    ``file:`` URIs and URLs with query options (read-only modes, ...): those keep the
    SQLAlchemy path.
    """
    try:
        parsed = make_url(url)
    except Exception:
        return None
    database = parsed.database
    if (
        not parsed.drivername.startswith("sqlite")
        or not database
        or database == ":memory:"
        or database.startswith("file:")
        or parsed.query
    ):
        return None
    return database


class SqliteRowWriter:
    """Executes one statement over many rows in one transaction, on a thread of its own.

    Args:
        path: the SQLite database file (already migrated: the sink's ``start`` checks).
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="servehall-sqlite")
        self._con: sqlite3.Connection | None = None
        self._closed = False

    async def executemany(self, sql: str, rows: Sequence[tuple[Any, ...]]) -> None:
        """Run ``sql`` for every row of ``rows`` in one transaction.

        Raises:
            sqlite3.Error: what SQLite raised (the transaction is rolled back).
        """
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._thread, self._executemany, sql, rows)

    def _connect(self) -> sqlite3.Connection:
        con = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        try:
            sqlite_pragmas(con)
        except BaseException:
            con.close()
            raise
        return con

    def _executemany(self, sql: str, rows: Sequence[tuple[Any, ...]]) -> None:
        con = self._con if self._con is not None else self._connect()
        self._con = con
        try:
            con.execute("BEGIN IMMEDIATE")
            con.executemany(sql, rows)
            con.execute("COMMIT")
        except BaseException as exc:
            if con.in_transaction:
                with contextlib.suppress(sqlite3.Error):
                    con.execute("ROLLBACK")
            if not isinstance(exc, BAD_DATA_ERRORS):  # reopen for the retry
                self._con = None
                con.close()
            raise

    async def close(self) -> None:
        """Close the connection and end the thread (idempotent)."""
        if self._closed:
            return
        self._closed = True
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._thread, self._close)
        self._thread.shutdown(wait=True)

    def _close(self) -> None:
        if self._con is not None:
            self._con.close()
            self._con = None
