"""``config_revision``: every config applied to a deployment, for history and rollback.

A revision is the config file's text as applied (TOML or YAML; secrets stay the
``{ env = ... }`` / ``{ file = ... }`` references the file holds), its SHA-256, who
applied it, when, and the unified diff against the previous revision. The newest
revision is the deployment's desired config: every replica polls it
(:class:`~servehall.rollout.live.LiveConfig`) and applies it live. A revision row and its
``config.applied`` audit event are written in one transaction, so the hash chain
(:mod:`servehall.records.chain`) holds every revision. A config a replica refused
because a new version failed to start, its probe or its accuracy gate is an audit event
``config.refused`` (:func:`record_refusal`, :func:`refusals`), listed by ``config
history`` beside the revisions.
"""

from __future__ import annotations

import difflib
import hashlib
from dataclasses import dataclass
from datetime import UTC, datetime

from sqlalchemy import Table, func, insert, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncEngine

from servehall.db.models import AuditEventRow, ConfigRevision
from servehall.records.chain import append_events
from servehall.records.types import AuditEvent

_T: Table = ConfigRevision.__table__  # type: ignore[assignment]


@dataclass(frozen=True, slots=True)
class Revision:
    """One ``config_revision`` row."""

    revision: int
    hash: str
    text: str
    fmt: str
    applied_by: str
    applied_at: datetime
    diff: str


def text_hash(text: str) -> str:
    """SHA-256 hex of the config text (UTF-8)."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def unified_diff(old: str, new: str, old_rev: int | None, new_rev: int) -> str:
    """The unified diff from revision ``old_rev`` (None: nothing) to ``new_rev``."""
    lines = difflib.unified_diff(
        old.splitlines(keepends=True),
        new.splitlines(keepends=True),
        fromfile=f"revision {old_rev}" if old_rev else "/dev/null",
        tofile=f"revision {new_rev}",
    )
    return "".join(lines)


def _row(r: object) -> Revision:
    return Revision(
        revision=int(r.revision),  # type: ignore[attr-defined]
        hash=str(r.hash),  # type: ignore[attr-defined]
        text=str(r.text),  # type: ignore[attr-defined]
        fmt=str(r.fmt),  # type: ignore[attr-defined]
        applied_by=str(r.applied_by),  # type: ignore[attr-defined]
        applied_at=r.applied_at,  # type: ignore[attr-defined]
        diff=str(r.diff),  # type: ignore[attr-defined]
    )


async def latest(engine: AsyncEngine) -> Revision | None:
    """The newest revision, or None when none was recorded."""
    async with engine.connect() as conn:
        r = (await conn.execute(select(_T).order_by(_T.c.revision.desc()).limit(1))).first()
    return None if r is None else _row(r)


async def latest_number(engine: AsyncEngine) -> int:
    """The newest revision's number (0: none); one small query, for polling."""
    async with engine.connect() as conn:
        n = (await conn.execute(select(func.max(_T.c.revision)))).scalar()
    return int(n or 0)


async def get(engine: AsyncEngine, revision: int) -> Revision | None:
    """Revision ``revision``, or None."""
    async with engine.connect() as conn:
        r = (await conn.execute(select(_T).where(_T.c.revision == revision))).first()
    return None if r is None else _row(r)


async def history(engine: AsyncEngine, limit: int = 50) -> list[Revision]:
    """The newest ``limit`` revisions, newest first."""
    async with engine.connect() as conn:
        rows = await conn.execute(select(_T).order_by(_T.c.revision.desc()).limit(limit))
        return [_row(r) for r in rows]


async def record(
    engine: AsyncEngine,
    text: str,
    fmt: str,
    applied_by: str,
    *,
    action: str = "config.applied",
    details: dict[str, object] | None = None,
    adopt_same: bool = False,
    target: str | None = None,
) -> Revision:
    """Store ``text`` as the next revision and audit it (one transaction; retried when
    another replica took the same number at the same moment).

    The audit event ``action`` (``config.applied`` / ``config.rollback`` /
    ``config.started`` / ``model.canary_rollback``) has target ``target`` (default
    ``revision N``) and details ``revision``, ``hash``, ``previous`` and ``details``.
    ``adopt_same``: when the newest revision already is this text, return it instead of
    storing a copy.
    """
    for _ in range(5):
        prev = await latest(engine)
        if adopt_same and prev is not None and prev.hash == text_hash(text):
            return prev  # another replica started with this config at the same moment
        number = (prev.revision if prev else 0) + 1
        now = datetime.now(UTC)
        rev = Revision(
            revision=number,
            hash=text_hash(text),
            text=text,
            fmt=fmt,
            applied_by=applied_by[:128],
            applied_at=now,
            diff=unified_diff(
                prev.text if prev else "", text, prev.revision if prev else None, number
            ),
        )
        event = AuditEvent(
            action=action,
            actor=applied_by[:128],
            target=target or f"revision {number}",
            details={
                "revision": number,
                "hash": rev.hash,
                "previous": prev.revision if prev else None,
                **(details or {}),
            },
            at=now,
        )
        try:
            async with engine.begin() as conn:
                await conn.execute(
                    insert(_T).values(
                        revision=rev.revision,
                        hash=rev.hash,
                        text=rev.text,
                        fmt=rev.fmt,
                        applied_by=rev.applied_by,
                        applied_at=rev.applied_at,
                        diff=rev.diff,
                    )
                )
                await append_events(conn, [event])
        except IntegrityError:
            continue
        return rev
    raise RuntimeError("could not record a config revision: the revision number kept moving")


@dataclass(frozen=True, slots=True)
class Refusal:
    """One ``config.refused`` audit event: a config a replica would not apply because a
    new version failed to start, its probe or its accuracy gate."""

    at: datetime
    actor: str
    target: str
    details: dict[str, object]


async def record_refusal(engine: AsyncEngine, event: AuditEvent) -> None:
    """Append ``event`` (a ``config.refused`` audit event) to the audit chain."""
    if event.at is None:
        event.at = datetime.now(UTC)
    async with engine.begin() as conn:
        await append_events(conn, [event])


async def refusals(engine: AsyncEngine, limit: int = 50) -> list[Refusal]:
    """The newest ``limit`` ``config.refused`` audit events, newest first."""
    a: Table = AuditEventRow.__table__  # type: ignore[assignment]
    async with engine.connect() as conn:
        rows = await conn.execute(
            select(a.c.at, a.c.actor, a.c.target, a.c.details)
            .where(a.c.action == "config.refused")
            .order_by(a.c.id.desc())
            .limit(limit)
        )
        return [
            Refusal(
                at=r.at,
                actor=str(r.actor),
                target=str(r.target or ""),
                details=dict(r.details or {}),
            )
            for r in rows
        ]
