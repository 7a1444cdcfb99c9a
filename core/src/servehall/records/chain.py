"""The tamper-evident audit chain in ``audit_event``.

Each row stores ``prev_hash`` (the previous row's ``hash``; 64 zeros for the first) and
``hash = sha256(prev_hash + canonical_json).hexdigest()`` where ``canonical_json`` is the
row's content ``{"action", "actor", "at", "details", "target"}`` as JSON with sorted
keys, no whitespace, UTF-8, ``at`` as ``YYYY-MM-DDTHH:MM:SS.ffffffZ`` (UTC).

Appends are serialised across processes and connections: a writer first updates the
single ``audit_chain_head`` row (a row lock on PostgreSQL, the write lock on SQLite),
then reads the tail, inserts its rows and moves the head — all in one transaction, so
two writers can never fork the chain. On PostgreSQL the wait for the head is bounded by
``lock_timeout`` and a writer stalled while holding it is ended by the server
(``idle_in_transaction_session_timeout``; see :class:`servehall.db.engine.DbTimeouts`),
so one stalled replica cannot stop the others. The head also records the last id and the event
count, so deleting rows from the end is detected too.

Each event carries its own id (``event_id``, unique; not part of the hashed content). An
append skips an event whose id is already stored (``INSERT … ON CONFLICT (event_id) DO
NOTHING`` on SQLite and PostgreSQL) and chains the next one to the last row actually
written, so a spill batch replayed after a crash that cut it off between its commit and
the saved replay position is chained once and the chain stays valid.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Insert, Table, func, insert, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from servehall.db.models import GENESIS_HASH, AuditChainHead, AuditEventRow
from servehall.records.codec import iso_utc
from servehall.records.rows import audit_row
from servehall.records.types import AuditEvent

_T: Table = AuditEventRow.__table__  # type: ignore[assignment]
_H: Table = AuditChainHead.__table__  # type: ignore[assignment]


def canonical(at: datetime, actor: str, action: str, target: str | None, details: Any) -> bytes:
    """The canonical JSON bytes of one audit row's content (see module docstring)."""
    return json.dumps(
        {"action": action, "actor": actor, "at": iso_utc(at), "details": details, "target": target},
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
    ).encode("utf-8")


def chain_hash(prev_hash: str, content: bytes) -> str:
    """SHA-256 hex of ``prev_hash`` (ASCII) followed by ``content``."""
    return hashlib.sha256(prev_hash.encode("ascii") + content).hexdigest()


def _insert_once(dialect: str, values: dict[str, Any]) -> Insert:
    """``INSERT`` of one audit row that does nothing when its ``event_id`` is stored."""
    if dialect == "postgresql":
        return (
            postgresql.insert(_T)
            .values(**values)
            .on_conflict_do_nothing(index_elements=[_T.c.event_id])
        )
    if dialect == "sqlite":
        return (
            sqlite.insert(_T)
            .values(**values)
            .on_conflict_do_nothing(index_elements=[_T.c.event_id])
        )
    return insert(_T).values(**values)


async def append_events(conn: AsyncConnection, events: Sequence[AuditEvent]) -> int:
    """Append ``events`` to the chain inside the caller's transaction on ``conn``; an
    event whose ``event_id`` is already stored (a replay) is skipped.

    Every event must have ``at`` set. Blocks while another writer holds the head.

    Returns:
        How many events were appended (``len(events)`` less the skipped ones).
    """
    if not events:
        return 0
    # Take the head's lock first (before any read), so the tail we read is the latest.
    await conn.execute(update(_H).where(_H.c.id == 1).values(events=_H.c.events + 0))
    head = (
        await conn.execute(select(_H.c.last_hash, _H.c.events, _H.c.last_id).where(_H.c.id == 1))
    ).one()
    prev, count, last_id = str(head.last_hash), int(head.events), int(head.last_id)
    appended = 0
    dialect = conn.dialect.name
    for ev in events:
        f = audit_row(ev)
        h = chain_hash(prev, canonical(f["at"], f["actor"], f["action"], f["target"], f["details"]))
        values = {**f, "event_id": ev.event_id, "prev_hash": prev, "hash": h}
        res = await conn.execute(_insert_once(dialect, values).returning(_T.c.id))
        new_id = res.scalar_one_or_none()
        if new_id is None:  # this event is in the chain already
            continue
        last_id = int(new_id)
        prev = h
        count += 1
        appended += 1
    if appended:
        await conn.execute(
            update(_H).where(_H.c.id == 1).values(last_id=last_id, last_hash=prev, events=count)
        )
    return appended


@dataclass(frozen=True, slots=True)
class VerifyResult:
    """Outcome of :func:`verify_chain`.

    ``ok`` is False when a problem was found: ``bad_id`` is the first bad row's id (or
    None when the problem is at the end of the chain) and ``reason`` says what is wrong.
    """

    ok: bool
    checked: int
    bad_id: int | None = None
    reason: str = ""


async def verify_chain(engine: AsyncEngine, page: int = 5000) -> VerifyResult:
    """Walk ``audit_event`` in id order and check every link and hash, then the head.

    Detects an edited row (its hash no longer matches its content), a deleted row (the
    next row's ``prev_hash`` does not match), a row inserted out of band (bad hash, or a
    broken link on the row after it), and rows deleted from the end (the head disagrees).
    """
    prev = GENESIS_HASH
    checked = 0
    last_id = 0
    async with engine.connect() as conn:
        while True:
            rows = (
                await conn.execute(
                    select(_T).where(_T.c.id > last_id).order_by(_T.c.id).limit(page)
                )
            ).all()
            for r in rows:
                if r.prev_hash != prev:
                    return VerifyResult(
                        False,
                        checked,
                        int(r.id),
                        "prev_hash does not match the previous row's hash "
                        "(a row before it was deleted, edited or inserted out of band)",
                    )
                want = chain_hash(prev, canonical(r.at, r.actor, r.action, r.target, r.details))
                if r.hash != want:
                    return VerifyResult(
                        False,
                        checked,
                        int(r.id),
                        "hash does not match the row's content (row edited or inserted "
                        "out of band)",
                    )
                prev = r.hash
                last_id = int(r.id)
                checked += 1
            if len(rows) < page:
                break
        head = (await conn.execute(select(_H).where(_H.c.id == 1))).one_or_none()
        total = (await conn.execute(select(func.count()).select_from(_T))).scalar_one()
    if head is None:
        return VerifyResult(False, checked, None, "audit_chain_head row is missing")
    if head.last_hash != prev or int(head.events) != checked or int(total) != checked:
        return VerifyResult(
            False,
            checked,
            int(head.last_id) or None,
            f"the chain ends at id {last_id or 'none'} with {checked} event(s) but "
            f"audit_chain_head records id {head.last_id} and {head.events} event(s) "
            "(rows deleted from the end, or the head was edited)",
        )
    return VerifyResult(True, checked)
