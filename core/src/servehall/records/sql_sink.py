"""The core's ``sql`` sink: request-log rows and the audit chain in the deployment DB.

Options (``[[sinks]] name = "sql"`` ``options``): ``url`` (default ``[database] url``).
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

import json
import logging
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import exc as sa_exc
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from servehall.db.engine import DbTimeouts, create_db_engine, database_url
from servehall.db.migrate import ensure_schema
from servehall.db.models import RequestLog
from servehall.db.types import to_utc
from servehall.records.chain import append_events
from servehall.records.checkpoint import CheckpointSigner, load_private_key
from servehall.records.codec import request_row
from servehall.records.sqlite_writer import BAD_DATA_ERRORS, SqliteRowWriter, sqlite_file
from servehall.records.types import AuditEvent, Record, RequestRecord, check_sink_options

if TYPE_CHECKING:
    from servehall.config.settings import Settings

log = logging.getLogger("servehall.records.sql")

_COLUMNS: tuple[str, ...] = tuple(c.name for c in RequestLog.__table__.columns)


def _bad_data(exc: BaseException) -> bool:
    """True only for errors caused by a record's content (never by the connection).

    Everything else — refused connections, a server shutting down, admin terminations,
    timeouts, missing tables — is retried, never dropped.
    """
    if isinstance(exc, BAD_DATA_ERRORS):  # the SQLite fast path's driver errors
        return True
    if isinstance(exc, sa_exc.DBAPIError):
        return isinstance(exc, sa_exc.DataError | sa_exc.IntegrityError) and not (
            exc.connection_invalidated
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
        """One row as driver-level values (no per-row SQLAlchemy type processing)."""
        row = request_row(rec)
        verdicts = row["filter_verdicts"]
        row["filter_verdicts"] = json.dumps(verdicts) if verdicts else "[]"
        for key in ("received_at", "finished_at"):
            value = row[key]
            if value is not None:
                value = to_utc(value)
                # SQLite: SQLAlchemy's DATETIME text form, naive UTC
                row[key] = (
                    value if self._pg else value.replace(tzinfo=None).isoformat(" ", "microseconds")
                )
        return tuple(row[c] for c in _COLUMNS)

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
        """Persist a batch in one transaction; raises on connection problems (retried).

        A batch rejected for its content (never expected: text is cleaned) is retried
        record by record and the offending records are logged and skipped, so one bad
        record cannot block the queue.
        """
        assert self.engine is not None, "start() first"
        try:
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
        except Exception as exc:
            if not _bad_data(exc) or len(records) == 0:
                raise
            log.error(
                "sql sink: batch rejected (%s); retrying record by record", type(exc).__name__
            )
            for rec in records:
                try:
                    async with self.engine.begin() as conn:
                        await self._write(conn, [rec])
                except Exception as one:
                    if not _bad_data(one):
                        raise
                    log.error(
                        "sql sink: dropped one %s record: %s",
                        type(rec).__name__,
                        type(one).__name__,
                    )

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
