"""Turning records into rows and JSON lines, safely.

* :func:`clean_text` makes any ``str`` storable on both databases: NUL (U+0000, which
  PostgreSQL text and JSON columns reject) is removed and lone UTF-16 surrogates (which
  cannot be encoded as UTF-8) become U+FFFD. Every text value and every string inside
  JSON values goes through it, so an insert never fails on text content (case C29).
* :func:`redact` masks values under secret-looking keys (``password``, ``api_key``,
  ``token``, ``authorization`` …) and pydantic ``SecretStr`` values in audit details.
* :func:`to_json` / :func:`from_json` are the lossless JSON-lines form used by the
  ``jsonl`` sink and the bus's spill file (times as ISO-8601 UTC).
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict
from datetime import UTC, datetime
from enum import Enum
from typing import Any

from pydantic import SecretStr

from servehall.config.secrets import MASK, URL_PASSWORD, is_secret_name
from servehall.records.types import AuditEvent, Record, RequestRecord


def clean_text(value: str) -> str:
    """``value`` without NUL characters and with lone surrogates replaced by U+FFFD."""
    if value.isascii():
        return value.replace("\x00", "") if "\x00" in value else value
    if "\x00" in value:
        value = value.replace("\x00", "")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        value = value.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    return value


def clean_json(value: Any) -> Any:
    """A JSON-able copy of ``value`` with every string cleaned (keys too).

    Tuples become lists, non-finite floats ``None``, unknown objects their ``str``.
    """
    if isinstance(value, str):
        return clean_text(value)
    if value is None or isinstance(value, bool | int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {clean_text(str(k)): clean_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [clean_json(v) for v in value]
    if isinstance(value, datetime):
        return iso_utc(value)
    if isinstance(value, SecretStr):
        return MASK
    return clean_text(str(value))


def redact(value: Any) -> Any:
    """``value`` with values under secret-looking keys, ``SecretStr`` values and the
    passwords of URLs (``scheme://user:password@host``) masked."""
    if isinstance(value, SecretStr):
        return MASK
    if isinstance(value, str):
        return URL_PASSWORD.sub(rf"\g<1>{MASK}\g<3>", value) if "://" in value else value
    if isinstance(value, dict):
        return {k: (MASK if is_secret_name(k) and v else redact(v)) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [redact(v) for v in value]
    return value


def iso_utc(value: datetime) -> str:
    """``value`` as ``YYYY-MM-DDTHH:MM:SS.ffffffZ`` in UTC (naive values are UTC)."""
    if value.tzinfo is not None:
        value = value.astimezone(UTC).replace(tzinfo=None)
    return value.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_iso(value: str) -> datetime:
    """Inverse of :func:`iso_utc` (also accepts offsets); an aware UTC datetime."""
    dt = datetime.fromisoformat(value.replace("Z", "+00:00"))
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return dt.astimezone(UTC)


def _opt(value: object) -> str | None:
    """None, or ``value`` as cleaned text (an enum as its value, another non-``str``
    value as its ``str``)."""
    if value is None:
        return None
    if isinstance(value, Enum):
        value = value.value
    return clean_text(value if isinstance(value, str) else str(value))


def request_fields(rec: RequestRecord) -> dict[str, Any]:
    """The fields of ``rec`` for its JSON-lines form (text cleaned; prompts as the bus
    left them; lists as lists). The database row is
    :func:`servehall.records.rows.request_row`."""
    return {
        "request_id": _opt(rec.request_id) or "",
        "received_at": rec.received_at,
        "finished_at": rec.finished_at,
        "principal_id": _opt(rec.principal_id),
        "tenant": _opt(rec.tenant),
        "model": _opt(rec.model),
        "backend": _opt(rec.backend),
        "endpoint": _opt(rec.endpoint) or "",
        "status_code": rec.status_code,
        "error_code": _opt(rec.error_code),
        "finish_reason": _opt(rec.finish_reason),
        "prompt_tokens": rec.prompt_tokens,
        "completion_tokens": rec.completion_tokens,
        "queue_time_s": rec.queue_time_s,
        "ttft_s": rec.ttft_s,
        "latency_s": rec.latency_s,
        "stream": rec.stream,
        "client_addr": _opt(rec.client_addr),
        "filter_verdicts": clean_json(rec.filter_verdicts) if rec.filter_verdicts else [],
        "prompt_text": _opt(rec.prompt_text),
        "completion_text": _opt(rec.completion_text),
        "replica": _opt(rec.replica),
        "response_format": _opt(rec.response_format),
        "tool_calls": None
        if rec.tool_calls is None
        else [clean_text(str(n)) for n in rec.tool_calls],
        "version": _opt(rec.version or None),
        "batch_id": _opt(rec.batch_id),
        "custom_id": _opt(rec.custom_id),
    }


def audit_fields(ev: AuditEvent) -> dict[str, Any]:
    """The stored (cleaned, redacted) content of an audit event; ``at`` must be set."""
    assert ev.at is not None
    return {
        "at": ev.at,
        "actor": clean_text(ev.actor),
        "action": clean_text(ev.action),
        "target": _opt(ev.target),
        "details": clean_json(redact(ev.details or {})),
    }


def to_json(record: Record) -> dict[str, Any]:
    """A JSON-able dict for ``record`` with ``"type": "request" | "audit"``."""
    if isinstance(record, RequestRecord):
        row = request_fields(record)
        row["received_at"] = iso_utc(record.received_at)
        row["finished_at"] = iso_utc(record.finished_at) if record.finished_at else None
        return {"type": "request", **row}
    ev = audit_fields(record) if record.at else {**asdict(record), "at": None}
    out = {"type": "audit", **ev, "event_id": record.event_id}
    if record.at is not None:
        out["at"] = iso_utc(record.at)
    return out


def dumps(record: Record) -> str:
    """One JSON line (no trailing newline) for ``record``."""
    return json.dumps(to_json(record), ensure_ascii=False, separators=(",", ":"))


def from_json(data: dict[str, Any]) -> Record:
    """Inverse of :func:`to_json`. Raises ValueError for an unknown ``type``."""
    data = dict(data)
    kind = data.pop("type", None)
    if kind == "request":
        data["received_at"] = parse_iso(data["received_at"])
        if data.get("finished_at"):
            data["finished_at"] = parse_iso(data["finished_at"])
        known = RequestRecord.__dataclass_fields__
        return RequestRecord(**{k: v for k, v in data.items() if k in known})
    if kind == "audit":
        at = data.get("at")
        event_id = data.get("event_id")
        if not isinstance(event_id, str) or not event_id:
            # a line written before events had ids: an id derived from its content, so
            # replaying the same line twice still appends it once
            canon = json.dumps(data, sort_keys=True, ensure_ascii=False, default=str)
            event_id = hashlib.sha256(canon.encode("utf-8")).hexdigest()
        return AuditEvent(
            action=data["action"],
            actor=data.get("actor", "system"),
            target=data.get("target"),
            details=data.get("details") or {},
            at=parse_iso(at) if at else None,
            event_id=event_id[:64],
        )
    raise ValueError(f"unknown record type {kind!r}")
