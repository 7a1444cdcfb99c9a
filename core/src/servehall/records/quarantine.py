"""Quarantine: where a record goes that the database refuses for its content.

A record that the sink cannot write while it writes others (see
:mod:`servehall.records.runner`) is kept alone with the error, so it can be looked at
and, once understood, re-entered by hand — and never blocks the records behind it:

* in the ``record_rejected`` table of the sink's database (:func:`insert_rejected`;
  ``payload`` is the record's JSON-lines form, the spill file's);
* or, when even that insert fails (or the sink has no table), as one JSON line in the
  quarantine file :func:`quarantine_path` — ``servehall-rejected-<sink>.jsonl`` next to
  the sink's spill file — ``{"rejected_at", "sink", "kind", "request_id", "error",
  "payload"}`` (:func:`quarantine_line`).

Both are named in the log with the request id, counted in
``servehall_records_rejected_total{sink}`` and listed by ``servehall db status``.
"""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import Executable, Table, func, select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from servehall.records.codec import clean_text, iso_utc
from servehall.records.rows import record_kind, record_payload
from servehall.records.types import Record, RequestRecord

if TYPE_CHECKING:  # the async engine stays out of light imports (plugin entry points)
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine


def _table() -> Table:
    """The ``record_rejected`` table (imported on first use: ``servehall.db`` loads the
    async engine, which light imports such as plugin entry points must not pull in)."""
    from servehall.db.models import RecordRejected

    return RecordRejected.__table__  # type: ignore[return-value]


ERROR_CHARS = 2000
"""Most characters of an error message kept with a quarantined record."""


def quarantine_path(sink: str, spill_path: str | Path | None) -> Path:
    """The quarantine file of sink ``sink``: ``servehall-rejected-<sink>.jsonl`` in the
    directory of its spill file (``spill_path``; the working directory when None)."""
    folder = Path(spill_path).expanduser().parent if spill_path else Path()
    return folder / f"servehall-rejected-{sink}.jsonl"


def request_id_of(record: Record) -> str | None:
    """The request id of a request record (None for an audit event)."""
    if isinstance(record, RequestRecord):
        rid = record.request_id
        return clean_text(rid if isinstance(rid, str) else str(rid))[:128]
    return None


def _error_text(error: str) -> str:
    return clean_text(error)[:ERROR_CHARS]


def rejected_row(sink: str, record: Record, error: str) -> dict[str, object]:
    """The ``record_rejected`` row for ``record`` refused with ``error``."""
    payload = record_payload(record)
    return {
        "rejected_at": datetime.now(UTC),
        "sink": clean_text(sink)[:128],
        "kind": record_kind(record),
        "request_id": request_id_of(record),
        "payload": payload,
        "payload_sha256": hashlib.sha256(payload.encode("utf-8")).hexdigest(),
        "error": _error_text(error),
    }


async def insert_rejected(conn: AsyncConnection, sink: str, record: Record, error: str) -> None:
    """Insert ``record``'s quarantine row in the caller's transaction on ``conn``; a row
    with the same sink and payload already there is left as it is."""
    row = rejected_row(sink, record, error)
    stmt: Executable
    if conn.dialect.name == "postgresql":
        stmt = pg_insert(_table()).values(**row).on_conflict_do_nothing()
    elif conn.dialect.name == "sqlite":
        stmt = sqlite_insert(_table()).values(**row).on_conflict_do_nothing()
    else:  # pragma: no cover - the core supports SQLite and PostgreSQL
        table = _table()
        exists = select(table.c.id).where(
            table.c.sink == row["sink"], table.c.payload_sha256 == row["payload_sha256"]
        )
        if (await conn.execute(exists)).first() is not None:
            return
        stmt = _table().insert().values(**row)
    await conn.execute(stmt)


def quarantine_line(sink: str, record: Record | None, error: str, raw: str | None = None) -> str:
    """One JSON line (no newline) for the quarantine file: ``record`` (or an unreadable
    spill-file line ``raw``, kind ``line``) with ``error``. Never raises."""
    out = {
        "rejected_at": iso_utc(datetime.now(UTC)),
        "sink": sink,
        "kind": record_kind(record) if record is not None else "line",
        "request_id": request_id_of(record) if record is not None else None,
        "error": _error_text(error),
        "payload": record_payload(record) if record is not None else clean_text(raw or ""),
    }
    return json.dumps(out, ensure_ascii=False, separators=(",", ":"))


async def count_rejected(engine: AsyncEngine) -> dict[str, int]:
    """``{sink: quarantined records}`` in ``record_rejected`` (empty when none)."""
    table = _table()
    async with engine.connect() as conn:
        rows = (await conn.execute(select(table.c.sink, func.count()).group_by(table.c.sink))).all()
    return {str(sink): int(n) for sink, n in rows}


def count_lines(path: Path) -> int:
    """Lines in the quarantine file ``path`` (0 when it does not exist)."""
    try:
        with path.open("rb") as fh:
            return sum(1 for _ in fh)
    except OSError:
        return 0
