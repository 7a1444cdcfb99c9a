"""The core's ``sql`` sink: request-log rows and the audit chain in the deployment DB.

Options (``[[sinks]] name = "sql"`` ``options``): ``url`` (default ``[database] url``).
Rows come from :func:`servehall.records.rows.request_row` (one serialisation for every
path). A batch refused with an error that may come from a row (:func:`suspect_row`) is
split by the runner: :meth:`SqlSink.probe` (a known-good row, rolled back) tells a bad
record from an outage, and :meth:`SqlSink.quarantine` keeps a bad one in
``record_rejected`` (:mod:`servehall.records.quarantine`).
Each batch is one transaction: the batch's ``request_log`` rows in one driver-level
``executemany`` (``ON CONFLICT (request_id) DO NOTHING``, so a batch retried after a
lost commit acknowledgement never duplicates a row), then its audit events appended to
the chain. On a SQLite file a batch of request rows alone goes through one thread hop
(:mod:`servehall.records.sqlite_writer`: the standard library's ``sqlite3``, not
SQLAlchemy + aiosqlite's round trip per call); batches with audit events, checkpoints and
the probe keep SQLAlchemy. Rows are converted to driver values here, once (no per-row
SQLAlchemy type processing on the event loop): timestamps as aware UTC on PostgreSQL and
as SQLAlchemy's SQLite text form, JSON as text.
On PostgreSQL the sink's sessions run with the ``[database]`` timeouts
(:class:`~servehall.db.engine.DbTimeouts`: statement, lock, idle-in-transaction), so a
write can neither wait forever on a server that stopped answering nor on the audit chain
head held by a stalled replica.
With ``[audit] signing_key`` set, the sink also signs the audit chain head into
``audit_checkpoint`` (:mod:`servehall.records.checkpoint`): after a batch, or on the
runner's idle probe, once ``checkpoint_interval_s`` passed since the last one, and on
``close()`` (shutdown).
``start()`` refuses an un-migrated database (``servehall db upgrade``) unless
``[database] auto_migrate`` is on.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import exc as sa_exc
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from servehall.db.engine import DbTimeouts, create_db_engine, database_url
from servehall.db.migrate import ensure_schema
from servehall.records.chain import append_events
from servehall.records.checkpoint import CheckpointSigner, load_private_key
from servehall.records.quarantine import insert_rejected
from servehall.records.rows import REQUEST_COLUMNS, driver_row, request_row
from servehall.records.sqlite_writer import SUSPECT_ERRORS, SqliteRowWriter, sqlite_file
from servehall.records.types import AuditEvent, Record, RequestRecord, check_sink_options

if TYPE_CHECKING:
    from servehall.config.settings import Settings

log = logging.getLogger("servehall.records.sql")

_COLUMNS = REQUEST_COLUMNS


SUSPECT_SQLSTATE_CLASSES = frozenset({"22", "23", "42", "54"})
"""SQLSTATE classes that may come from a row's content: data exception, integrity
constraint violation, syntax or access rule (a value of the wrong type; also a missing
table, which the probe tells apart), program limit exceeded (a row too big)."""


def _sqlstate(exc: BaseException) -> str | None:
    """The SQLSTATE of a database error (the exception, its DBAPI error or the driver's
    error under that), or None."""
    orig = getattr(exc, "orig", None)
    for err in (exc, orig, getattr(orig, "__cause__", None)):
        state = getattr(err, "sqlstate", None) or getattr(err, "pgcode", None)
        if isinstance(state, str) and len(state) == 5:
            return state
    return None


def suspect_row(exc: BaseException) -> bool:
    """True when ``exc`` may come from a record's content rather than from the database.

    The driver's data, integrity and programming errors (a bad value, a constraint, a
    value it cannot bind), errors whose SQLSTATE is in :data:`SUSPECT_SQLSTATE_CLASSES`,
    a bind error raised by the driver itself (asyncpg's ``DataError`` is a
    ``ValueError``) and Python's ``ValueError``/``TypeError`` — unless the connection
    was lost with them. The runner then writes the batch record by record and
    quarantines a record only when :meth:`SqlSink.probe` shows that the database takes a
    known-good one (a missing table or privilege is a programming error too, and fails
    the probe). Refused connections, a server shutting down, admin terminations,
    timeouts and lock or serialization failures are outages: retried, never quarantined.
    """
    if isinstance(exc, SUSPECT_ERRORS):  # the SQLite fast path's driver errors
        return True
    if isinstance(exc, sa_exc.DBAPIError):
        if exc.connection_invalidated:
            return False
        if isinstance(exc, sa_exc.DataError | sa_exc.IntegrityError | sa_exc.ProgrammingError):
            return True
        state = _sqlstate(exc)
        if state is not None:
            return state[:2] in SUSPECT_SQLSTATE_CLASSES
        orig = exc.orig
        return isinstance(orig, ValueError | TypeError) or isinstance(
            getattr(orig, "__cause__", None), ValueError | TypeError
        )
    return isinstance(exc, sa_exc.StatementError | ValueError | TypeError)


class SqlSink:
    """Writes records to ``request_log`` / ``audit_event`` (see module docstring)."""

    def __init__(
        self,
        url: str,
        *,
        auto_migrate: bool = False,
        name: str = "sql",
        timeouts: DbTimeouts | None = None,
        signer: CheckpointSigner | None = None,
    ) -> None:
        self.name = name
        self.signer = signer
        self.timeouts = timeouts or DbTimeouts()
        self.required = False
        self.url = url
        self.auto_migrate = auto_migrate
        self.engine: AsyncEngine | None = None
        self._insert = ""
        self._pg = False
        self._rows: SqliteRowWriter | None = None

    async def start(self) -> None:
        """Connect and check (or migrate) the schema; ConfigError when not migrated."""
        self.engine = create_db_engine(self.url, timeouts=self.timeouts)
        await ensure_schema(self.engine, auto_migrate=self.auto_migrate)
        self._pg = self.engine.dialect.name == "postgresql"
        marks = ", ".join(f"${i + 1}" if self._pg else "?" for i in range(len(_COLUMNS)))
        self._insert = (
            f"INSERT INTO request_log ({', '.join(_COLUMNS)}) VALUES ({marks}) "
            "ON CONFLICT (request_id) DO NOTHING"
        )
        path = sqlite_file(self.url)
        if path is not None:
            self._rows = SqliteRowWriter(path)

    def _values(self, rec: RequestRecord) -> tuple[Any, ...]:
        """One row as driver-level values (:func:`~servehall.records.rows.request_row`,
        no per-row SQLAlchemy type processing)."""
        return driver_row(request_row(rec), postgresql=self._pg)

    async def _write(self, conn: AsyncConnection, records: Sequence[Record]) -> None:
        rows = [self._values(r) for r in records if isinstance(r, RequestRecord)]
        if rows:
            await conn.exec_driver_sql(self._insert, rows)
        events = [r for r in records if isinstance(r, AuditEvent)]
        for ev in events:
            if ev.at is None:
                ev.at = datetime.now(UTC)
        await append_events(conn, events)

    def _rows_alone(self, records: Sequence[Record]) -> bool:
        """Whether ``records`` go through the SQLite fast path: a SQLite file, no audit
        event in the batch and no checkpoint due."""
        return (
            self._rows is not None
            and not any(isinstance(r, AuditEvent) for r in records)
            and (self.signer is None or not self.signer.due(time.monotonic()))
        )

    async def write(self, records: Sequence[Record]) -> None:
        """Persist a batch in one transaction; raises what the database raised (the
        runner retries, or splits the batch when :func:`suspect_row` says a record may be
        the cause)."""
        assert self.engine is not None, "start() first"
        if self._rows_alone(records):
            assert self._rows is not None
            rows = [self._values(r) for r in records if isinstance(r, RequestRecord)]
            if rows:
                await self._rows.executemany(self._insert, rows)
            return
        async with self.engine.begin() as conn:
            await self._write(conn, records)
            if self.signer is not None and self.signer.due(time.monotonic()):
                await self.signer.sign(conn, time.monotonic())

    def suspect(self, exc: BaseException) -> bool:
        """Whether ``exc`` may come from a record's content (:func:`suspect_row`)."""
        return suspect_row(exc)

    async def probe(self) -> None:
        """Write a known-good request row and audit event in a transaction that is rolled
        back: raises what the database raises when it cannot take a good record now
        (unreachable, read-only, a missing table or privilege), so the runner tells an
        outage from a bad record."""
        assert self.engine is not None, "start() first"
        now = datetime.now(UTC)
        good = RequestRecord(request_id=f"servehall-probe-{uuid.uuid4().hex}", received_at=now)
        event = AuditEvent(action="records.probe", at=now)
        async with self.engine.connect() as conn:
            trans = await conn.begin()
            try:
                await conn.exec_driver_sql(self._insert, [self._values(good)])
                await append_events(conn, [event])
            finally:
                await trans.rollback()

    async def quarantine(self, record: Record, error: str) -> None:
        """Keep ``record`` in ``record_rejected`` with ``error`` (the same record kept
        again, e.g. by a replay, is stored once). Raises when the row cannot be written
        (the runner then uses the quarantine file)."""
        assert self.engine is not None, "start() first"
        async with self.engine.begin() as conn:
            await insert_rejected(conn, self.name, record, error)

    async def check(self) -> None:
        """``SELECT 1`` on a pooled connection (the runner's idle probe); raises what the
        driver raises when the database is unreachable."""
        assert self.engine is not None, "start() first"
        async with self.engine.connect() as conn:
            await conn.exec_driver_sql("SELECT 1")
        if self.signer is not None and self.signer.due(time.monotonic()):
            await self.checkpoint()

    async def checkpoint(self) -> bool:
        """Sign the chain head now (when a signer is set and the head moved since this
        sink's last checkpoint); True when a checkpoint row was written."""
        assert self.engine is not None, "start() first"
        if self.signer is None:
            return False
        async with self.engine.begin() as conn:
            return await self.signer.sign(conn, time.monotonic())

    async def close(self) -> None:
        """Write a last checkpoint (with a signer; a failure is logged), then dispose of
        the engine's connections. Idempotent."""
        if self.engine is not None and self.signer is not None:
            try:
                await self.checkpoint()
            except Exception as exc:  # the database may be the reason we are closing
                log.error("sql sink: last audit checkpoint not written: %s", exc)
        if self._rows is not None:
            await self._rows.close()
            self._rows = None
        if self.engine is not None:
            await self.engine.dispose()
            self.engine = None


def sql_sink_factory(options: dict[str, Any], settings: Settings) -> SqlSink:
    """``SinkSpec`` factory for ``sql``: options ``url`` (default ``[database] url``).

    Raises:
        ConfigError: an unknown option.
    """
    check_sink_options("sql", options, ("url",))
    url = str(options.get("url") or database_url(settings))
    audit = settings.audit
    signer = (
        CheckpointSigner(
            load_private_key(audit.signing_key.get_secret_value()), audit.checkpoint_interval_s
        )
        if audit.signing_key is not None
        else None
    )
    return SqlSink(
        url,
        auto_migrate=settings.database.auto_migrate,
        timeouts=DbTimeouts.of(settings),
        signer=signer,
    )
