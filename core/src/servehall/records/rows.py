"""Records as the rows the database stores: one serialisation for every write path.

:func:`request_row` turns a :class:`~servehall.records.types.RequestRecord` into the
``request_log`` row — the only place where a record's fields become column values. The
``sql`` sink's SQLite fast path (:mod:`servehall.records.sqlite_writer`), its SQLAlchemy
path on SQLite and its asyncpg path on PostgreSQL all bind what it returns (after
:func:`driver_row` has put the timestamps in the driver's form), so a value that one path
accepts and another rejects cannot exist. What it guarantees for every column:

* JSON columns (``filter_verdicts``, ``tool_calls``) are JSON **text**: ``[]`` for no
  verdicts, ``NULL`` for ``tool_calls`` when the request offered no tools. Inside, every
  string is cleaned (:func:`~servehall.records.codec.clean_json`).
* text columns hold ``str`` (an enum becomes its value, any other object its ``str``),
  without NUL and lone surrogates (:func:`~servehall.records.codec.clean_text`), cut to
  the column's length (``String(n)``: PostgreSQL rejects longer values);
* integer columns hold ``int`` within PostgreSQL's ``INTEGER`` range (clamped), float
  columns finite ``float`` or ``NULL``, ``stream`` a ``bool``;
* timestamps are aware UTC ``datetime`` (``finished_at`` may be ``NULL``).

:func:`audit_row` does the same for the stored content of an audit event (the fields
the audit chain hashes). :func:`record_payload` is the JSON text kept for a record that
could not be written at all (``record_rejected.payload``, the quarantine file); it never
raises.
"""

from __future__ import annotations

import enum
import json
import math
from dataclasses import asdict
from datetime import datetime
from typing import Any

from sqlalchemy import Column, String

from servehall.db.models import AuditEventRow, RequestLog
from servehall.db.types import to_utc
from servehall.records.codec import clean_json, clean_text, dumps, redact
from servehall.records.types import AuditEvent, Record, RequestRecord

INT_MIN, INT_MAX = -(2**31), 2**31 - 1
"""Range of an ``INTEGER`` column on PostgreSQL (SQLite's is wider)."""


def _lengths(columns: Any) -> dict[str, int]:
    """``{column: n}`` for each ``String(n)`` column."""
    out: dict[str, int] = {}
    for col in columns:
        assert isinstance(col, Column)
        if isinstance(col.type, String) and col.type.length:
            out[col.name] = int(col.type.length)
    return out


REQUEST_COLUMNS: tuple[str, ...] = tuple(c.name for c in RequestLog.__table__.columns)
"""``request_log``'s columns, in table order (the order :func:`driver_row` returns)."""

_REQUEST_LENGTHS = _lengths(RequestLog.__table__.columns)
_AUDIT_LENGTHS = _lengths(AuditEventRow.__table__.columns)


def _text(value: object, limit: int | None) -> str:
    """``value`` as storable text (enum → its value, other objects → ``str``), cut to
    ``limit`` characters when given."""
    if isinstance(value, enum.Enum):
        value = value.value
    text = clean_text(value if type(value) is str else str(value))
    return text[:limit] if limit is not None else text


def _opt_text(value: object, limit: int | None) -> str | None:
    return None if value is None else _text(value, limit)


def _int(value: object) -> int:
    """An ``int`` in PostgreSQL's ``INTEGER`` range (bools and floats converted; junk 0)."""
    try:
        number = int(value)  # type: ignore[call-overload]
    except (TypeError, ValueError, OverflowError):
        return 0
    return min(max(number, INT_MIN), INT_MAX)


def _float(value: object) -> float | None:
    """A finite ``float`` or None."""
    if value is None:
        return None
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError, OverflowError):
        return None
    return number if math.isfinite(number) else None


def _json_text(value: object) -> str:
    """Compact JSON text of ``value`` with every string cleaned."""
    return json.dumps(clean_json(value), ensure_ascii=False, separators=(",", ":"))


def request_row(record: RequestRecord) -> dict[str, object]:
    """The ``request_log`` row of ``record``: ``{column: value}`` for every column.

    Values are plain ``str``/``int``/``float``/``bool``/``None`` and aware UTC
    ``datetime`` (see the module docstring for each column's rule). Never raises for any
    value a field can hold: a field of an unexpected type is converted, not rejected.
    """
    n = _REQUEST_LENGTHS
    verdicts = record.filter_verdicts
    tool_calls = record.tool_calls
    return {
        "request_id": _text(record.request_id, n["request_id"]),
        "received_at": to_utc(record.received_at),
        "finished_at": to_utc(record.finished_at) if record.finished_at is not None else None,
        "principal_id": _opt_text(record.principal_id, n["principal_id"]),
        "tenant": _opt_text(record.tenant, n["tenant"]),
        "model": _opt_text(record.model, n["model"]),
        "backend": _opt_text(record.backend, n["backend"]),
        "endpoint": _text(record.endpoint or "", n["endpoint"]),
        "status_code": _int(record.status_code),
        "error_code": _opt_text(record.error_code, n["error_code"]),
        "finish_reason": _opt_text(record.finish_reason, n["finish_reason"]),
        "prompt_tokens": _int(record.prompt_tokens),
        "completion_tokens": _int(record.completion_tokens),
        "queue_time_s": _float(record.queue_time_s),
        "ttft_s": _float(record.ttft_s),
        "latency_s": _float(record.latency_s),
        "stream": bool(record.stream),
        "client_addr": _opt_text(record.client_addr, n["client_addr"]),
        "filter_verdicts": _json_text(list(verdicts)) if verdicts else "[]",
        "prompt_text": _opt_text(record.prompt_text, None),
        "completion_text": _opt_text(record.completion_text, None),
        "replica": _opt_text(record.replica, n["replica"]),
        "response_format": _opt_text(record.response_format, n["response_format"]),
        "tool_calls": None
        if tool_calls is None
        else _json_text([_text(name, None) for name in tool_calls]),
        "version": _opt_text(record.version or None, n["version"]),
        "batch_id": _opt_text(record.batch_id, n["batch_id"]),
        "custom_id": _opt_text(record.custom_id, n["custom_id"]),
    }


def driver_row(row: dict[str, object], *, postgresql: bool) -> tuple[object, ...]:
    """``row`` (from :func:`request_row`) as a tuple in :data:`REQUEST_COLUMNS` order, with
    the timestamps as the driver binds them: aware UTC ``datetime`` for asyncpg, and on
    SQLite the text form SQLAlchemy's ``DateTime`` reads back (naive UTC,
    ``YYYY-MM-DD HH:MM:SS.ffffff``)."""
    if not postgresql:
        row = dict(row)
        for key in ("received_at", "finished_at"):
            value = row[key]
            if isinstance(value, datetime):
                row[key] = value.replace(tzinfo=None).isoformat(" ", "microseconds")
    return tuple(row[c] for c in REQUEST_COLUMNS)


def audit_row(event: AuditEvent) -> dict[str, Any]:
    """The stored content of an audit event (``at`` must be set): ``at`` (aware UTC),
    ``actor``/``action``/``target`` cleaned and cut to their columns, ``details`` redacted
    and cleaned (a JSON-able dict; anything else is wrapped as ``{"value": …}``)."""
    assert event.at is not None, "audit events get their time when emitted"
    n = _AUDIT_LENGTHS
    details = clean_json(redact(event.details or {}))
    if not isinstance(details, dict):
        details = {"value": details}
    return {
        "at": to_utc(event.at),
        "actor": _text(event.actor, n["actor"]),
        "action": _text(event.action, n["action"]),
        "target": _opt_text(event.target, n["target"]),
        "details": details,
    }


def record_kind(record: Record) -> str:
    """``"request"`` or ``"audit"``."""
    return "request" if isinstance(record, RequestRecord) else "audit"


def record_payload(record: Record) -> str:
    """JSON text of ``record`` for the quarantine: its JSON-lines form
    (:func:`~servehall.records.codec.dumps`, the spill file's) or, when even that
    fails, a best-effort form of every field. Never raises."""
    try:
        return dumps(record)
    except Exception:
        pass
    try:
        fields = asdict(record)
    except Exception:
        fields = {"repr": repr(record)}
    fields["type"] = record_kind(record)
    try:
        return json.dumps(clean_json(fields), ensure_ascii=False, default=str)
    except Exception:
        return json.dumps({"type": record_kind(record), "repr": clean_text(repr(record))})
