"""Batches and their lines in the records database (``batch``, ``batch_line``).

State machine of a batch (OpenAI's statuses)::

    validating ─▶ in_progress ─▶ finalizing ─▶ completed | expired
         │             │
         └─────────────┴─▶ cancelling ─▶ cancelled

``failed`` is OpenAI's status of a batch whose input failed validation; this server
checks the input when the batch is created (a 400), so it never stores one.

A line is ``pending`` until a runner claims it (``running``, ``claimed_by``,
``claimed_at``, ``attempt`` + 1), then ``completed`` or ``failed`` with its output-file
line in ``result`` — or ``expired`` (the completion window passed before it ran) or
``cancelled`` (the batch was cancelled before it ran).

Exactly once: a claim is one ``WITH picked AS MATERIALIZED (SELECT … LIMIT n FOR UPDATE
SKIP LOCKED) UPDATE … WHERE seq IN (SELECT seq FROM picked)`` on PostgreSQL (replicas skip
each other's locked rows), ``UPDATE … WHERE seq IN (SELECT … LIMIT n)`` on SQLite (one
writer at a time); a result is stored only by
the claim that holds the line (``claimed_by`` and ``attempt`` match, status
``running``), and a stored result is never claimed again. A running line whose claim was
not renewed for ``lease_s`` (its runner died) is claimed again. A batch is finalized by
the one runner whose conditional ``UPDATE`` takes it (the same lease).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Table, and_, case, exists, func, insert, or_, select, update
from sqlalchemy.ext.asyncio import AsyncEngine

from servehall.batches.lines import expired_line
from servehall.batches.wire import BatchObject
from servehall.db.models import BatchLine, BatchRow

_B: Table = BatchRow.__table__  # type: ignore[assignment]
_L: Table = BatchLine.__table__  # type: ignore[assignment]

OPEN = ("validating", "in_progress", "finalizing", "cancelling")
"""Statuses of a batch not yet done."""
UNDONE = ("pending", "running")
"""Statuses of a line not yet done."""

_TIMES = (
    "created_at",
    "in_progress_at",
    "expires_at",
    "finalizing_at",
    "completed_at",
    "failed_at",
    "expired_at",
    "cancelling_at",
    "cancelled_at",
)


def _unix(value: datetime | None) -> int | None:
    return None if value is None else int(value.timestamp())


@dataclass(frozen=True, slots=True)
class Batch:
    """One ``batch`` row and its line counts (``total``, ``completed``, ``failed``:
    failed and expired lines)."""

    id: str
    owner: str
    principal: dict[str, Any]
    endpoint: str
    input_file_id: str
    completion_window: str
    status: str
    metadata: dict[str, Any] | None
    times: dict[str, datetime | None]
    output_file_id: str | None
    error_file_id: str | None
    counts: dict[str, int]

    def wire(self) -> dict[str, Any]:
        """OpenAI's batch object (:class:`~servehall.batches.wire.BatchObject`; times in
        Unix seconds, ``errors`` null)."""
        return BatchObject.model_validate(
            {
                "id": self.id,
                "endpoint": self.endpoint,
                "input_file_id": self.input_file_id,
                "completion_window": self.completion_window,
                "status": self.status,
                "output_file_id": self.output_file_id,
                "error_file_id": self.error_file_id,
                **{k: _unix(self.times.get(k)) for k in _TIMES},
                "request_counts": self.counts,
                "metadata": self.metadata,
            }
        ).model_dump(mode="json")


@dataclass(frozen=True, slots=True)
class Claimed:
    """A line a runner claimed: run ``body`` (JSON text) once, then store the result
    with ``attempt``."""

    seq: int
    batch_id: str
    custom_id: str
    body: str
    attempt: int


@dataclass(frozen=True, slots=True)
class NewLine:
    """A line of a batch being created: its 1-based line number, ``custom_id`` and body
    (JSON text)."""

    line_no: int
    custom_id: str
    body: str


class UnknownCursor(LookupError):
    """``after`` names no batch of this owner."""


class BatchStore:
    """``batch`` and ``batch_line`` rows through ``engine`` (SQLite or PostgreSQL)."""

    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine

    # --- the API's side -------------------------------------------------------------

    async def create(
        self,
        *,
        batch_id: str,
        owner: str,
        principal: dict[str, Any],
        endpoint: str,
        input_file_id: str,
        completion_window: str,
        metadata: dict[str, Any] | None,
        lines: Sequence[NewLine],
        now: datetime,
        expires_at: datetime,
    ) -> Batch:
        """Insert a batch (status ``validating``) and its lines (``pending``), in one
        transaction; the batch."""
        async with self.engine.begin() as conn:
            await conn.execute(
                insert(_B).values(
                    id=batch_id,
                    owner=owner,
                    principal=principal,
                    endpoint=endpoint,
                    input_file_id=input_file_id,
                    completion_window=completion_window,
                    status="validating",
                    metadata=metadata,
                    created_at=now,
                    expires_at=expires_at,
                )
            )
            rows = [
                {
                    "batch_id": batch_id,
                    "line_no": ln.line_no,
                    "custom_id": ln.custom_id,
                    "body": ln.body,
                    "status": "pending",
                    "attempt": 0,
                }
                for ln in lines
            ]
            for i in range(0, len(rows), 1000):
                await conn.execute(insert(_L), rows[i : i + 1000])
        got = await self.get(batch_id, owner)
        assert got is not None
        return got

    async def _counts(self, conn: Any, ids: Sequence[str]) -> dict[str, dict[str, int]]:
        q = (
            select(_L.c.batch_id, _L.c.status, func.count())
            .where(_L.c.batch_id.in_(list(ids)))
            .group_by(_L.c.batch_id, _L.c.status)
        )
        out = {i: {"total": 0, "completed": 0, "failed": 0} for i in ids}
        for bid, status, n in (await conn.execute(q)).all():
            c = out[bid]
            c["total"] += n
            if status == "completed":
                c["completed"] += n
            elif status in ("failed", "expired"):
                c["failed"] += n
        return out

    @staticmethod
    def _batch(r: Any, counts: dict[str, int]) -> Batch:
        m = r._mapping
        return Batch(
            id=m["id"],
            owner=m["owner"],
            principal=m["principal"],
            endpoint=m["endpoint"],
            input_file_id=m["input_file_id"],
            completion_window=m["completion_window"],
            status=m["status"],
            metadata=m["metadata"],
            times={k: m[k] for k in _TIMES},
            output_file_id=m["output_file_id"],
            error_file_id=m["error_file_id"],
            counts=counts,
        )

    async def get(self, batch_id: str, owner: str | None) -> Batch | None:
        """The batch ``batch_id`` when ``owner`` owns it (any owner when None)."""
        q = select(_B).where(_B.c.id == batch_id)
        if owner is not None:
            q = q.where(_B.c.owner == owner)
        async with self.engine.connect() as conn:
            r = (await conn.execute(q)).first()
            if r is None:
                return None
            counts = await self._counts(conn, [batch_id])
        return self._batch(r, counts[batch_id])

    async def page(
        self, owner: str, *, after: str | None = None, limit: int = 20
    ) -> tuple[list[Batch], bool]:
        """``owner``'s batches, newest first, after the batch ``after``; at most
        ``limit``; and whether more follow.

        Raises:
            UnknownCursor: ``after`` names no batch of ``owner``.
        """
        async with self.engine.connect() as conn:
            q = select(_B).where(_B.c.owner == owner)
            if after is not None:
                seq = (
                    await conn.execute(
                        select(_B.c.seq).where(_B.c.id == after, _B.c.owner == owner)
                    )
                ).scalar()
                if seq is None:
                    raise UnknownCursor(after)
                q = q.where(_B.c.seq < seq)
            rows = (await conn.execute(q.order_by(_B.c.seq.desc()).limit(limit + 1))).all()
            more = len(rows) > limit
            rows = rows[:limit]
            counts = await self._counts(conn, [r.id for r in rows])
        return [self._batch(r, counts[r.id]) for r in rows], more

    async def cancel(self, batch_id: str, owner: str, now: datetime) -> tuple[Batch, bool] | None:
        """Cancel ``owner``'s batch ``batch_id``: a ``validating`` or ``in_progress``
        batch turns ``cancelling`` and its pending lines ``cancelled`` (no runner
        claims them after this); lines already running finish. None when there is no
        such batch; else the batch and whether this call cancelled it."""
        async with self.engine.begin() as conn:
            done = await conn.execute(
                update(_B)
                .where(
                    _B.c.id == batch_id,
                    _B.c.owner == owner,
                    _B.c.status.in_(("validating", "in_progress")),
                )
                .values(status="cancelling", cancelling_at=now)
            )
            changed = done.rowcount == 1
            if changed:
                await conn.execute(
                    update(_L)
                    .where(_L.c.batch_id == batch_id, _L.c.status == "pending")
                    .values(status="cancelled", finished_at=now)
                )
        got = await self.get(batch_id, owner)
        return None if got is None else (got, changed)

    # --- the runner's side ----------------------------------------------------------

    async def any_open(self) -> bool:
        """True when some batch is not done yet (one indexed read)."""
        q = select(exists().where(_B.c.status.in_(OPEN)))
        async with self.engine.connect() as conn:
            return bool((await conn.execute(q)).scalar())

    async def start_validated(self, now: datetime) -> int:
        """Every ``validating`` batch turns ``in_progress``; how many did."""
        async with self.engine.begin() as conn:
            done = await conn.execute(
                update(_B)
                .where(_B.c.status == "validating")
                .values(status="in_progress", in_progress_at=now)
            )
        return int(done.rowcount or 0)

    async def expire_due(self, now: datetime, lease_s: float) -> int:
        """Lines of batches past ``expires_at`` that have not run (pending, or running
        under a claim not renewed for ``lease_s``) turn ``expired``; how many did."""
        stale = now - timedelta(seconds=lease_s)
        due = select(_B.c.id).where(_B.c.status.in_(OPEN), _B.c.expires_at <= now)
        async with self.engine.begin() as conn:
            done = await conn.execute(
                update(_L)
                .where(
                    _L.c.batch_id.in_(due),
                    or_(
                        _L.c.status == "pending",
                        and_(_L.c.status == "running", _L.c.claimed_at < stale),
                    ),
                )
                .values(status="expired", finished_at=now)
            )
            if done.rowcount:
                await conn.execute(
                    update(_B)
                    .where(_B.c.status == "validating", _B.c.expires_at <= now)
                    .values(status="in_progress", in_progress_at=now)
                )
        return int(done.rowcount or 0)

    async def claim(
        self,
        runner: str,
        n: int,
        now: datetime,
        lease_s: float,
        skip_batches: Sequence[str] = (),
    ) -> list[Claimed]:
        """Claim up to ``n`` lines for ``runner``: pending lines (or lines whose claim
        lapsed: ``lease_s``) of ``in_progress`` batches not past their expiry and not in
        ``skip_batches``, oldest first."""
        if n <= 0:
            return []
        stale = now - timedelta(seconds=lease_s)
        claimable = or_(
            _L.c.status == "pending", and_(_L.c.status == "running", _L.c.claimed_at < stale)
        )
        active = select(_B.c.id).where(_B.c.status == "in_progress", _B.c.expires_at > now)
        if skip_batches:
            active = active.where(_B.c.id.not_in(list(skip_batches)))
        pick = select(_L.c.seq).where(claimable, _L.c.batch_id.in_(active)).order_by(_L.c.seq)
        pick = pick.limit(n)
        if self.engine.dialect.name == "postgresql":
            # a CTE runs once: a subquery under IN may be scanned again while the UPDATE
            # runs, and then skips the rows it just took and returns others (> n rows)
            picked = (
                pick.with_for_update(skip_locked=True)
                .cte("picked")
                .prefix_with("MATERIALIZED", dialect="postgresql")
            )
            chosen: Any = _L.c.seq.in_(select(picked.c.seq))
        else:
            chosen = _L.c.seq.in_(pick)
        stmt = (
            update(_L)
            .where(chosen, claimable)
            .values(status="running", claimed_by=runner, claimed_at=now, attempt=_L.c.attempt + 1)
            .returning(_L.c.seq, _L.c.batch_id, _L.c.custom_id, _L.c.body, _L.c.attempt)
        )
        async with self.engine.begin() as conn:
            rows = (await conn.execute(stmt)).all()
        return sorted(
            (Claimed(int(r[0]), str(r[1]), str(r[2]), str(r[3]), int(r[4])) for r in rows),
            key=lambda c: c.seq,
        )

    async def renew(self, runner: str, seqs: Sequence[int], now: datetime) -> None:
        """Renew ``runner``'s claims on the lines ``seqs`` (still running)."""
        if not seqs:
            return
        async with self.engine.begin() as conn:
            await conn.execute(
                update(_L)
                .where(
                    _L.c.seq.in_(list(seqs)),
                    _L.c.claimed_by == runner,
                    _L.c.status == "running",
                )
                .values(claimed_at=now)
            )

    def _held(self, line: Claimed, runner: str) -> Any:
        return and_(
            _L.c.seq == line.seq,
            _L.c.claimed_by == runner,
            _L.c.attempt == line.attempt,
            _L.c.status == "running",
        )

    async def finish(
        self,
        line: Claimed,
        runner: str,
        *,
        ok: bool,
        status_code: int | None,
        request_id: str | None,
        result: str,
        now: datetime,
    ) -> bool:
        """Store the result of ``line`` (``completed`` when ``ok``, else ``failed``) if
        ``runner`` still holds this claim; whether it did."""
        async with self.engine.begin() as conn:
            done = await conn.execute(
                update(_L)
                .where(self._held(line, runner))
                .values(
                    status="completed" if ok else "failed",
                    status_code=status_code,
                    request_id=request_id,
                    result=result,
                    finished_at=now,
                )
            )
        return done.rowcount == 1

    async def release(self, line: Claimed, runner: str) -> bool:
        """Give ``line`` back (``pending``) if ``runner`` still holds this claim: it
        did not run (shutdown, a full queue); whether it did."""
        async with self.engine.begin() as conn:
            done = await conn.execute(
                update(_L).where(self._held(line, runner)).values(status="pending")
            )
        return done.rowcount == 1

    async def finalizable(self, now: datetime, lease_s: float) -> list[str]:
        """Ids of open batches with no line left to run and no live finalizing claim."""
        stale = now - timedelta(seconds=lease_s)
        undone = exists().where(_L.c.batch_id == _B.c.id, _L.c.status.in_(UNDONE))
        q = select(_B.c.id).where(
            _B.c.status.in_(("in_progress", "finalizing", "cancelling")),
            or_(_B.c.claimed_by.is_(None), _B.c.claimed_at < stale),
            ~undone,
        )
        async with self.engine.connect() as conn:
            return [str(r[0]) for r in (await conn.execute(q)).all()]

    async def claim_finalize(
        self, batch_id: str, runner: str, now: datetime, lease_s: float
    ) -> tuple[Batch, str] | None:
        """Take the finalizing of ``batch_id`` for ``runner`` (an ``in_progress`` batch
        turns ``finalizing``); the batch and the status it ends in (``cancelled`` for a
        cancelling batch, ``expired`` when a line expired, else ``completed``), or None
        when another runner holds it or lines are left."""
        stale = now - timedelta(seconds=lease_s)
        undone = exists().where(_L.c.batch_id == _B.c.id, _L.c.status.in_(UNDONE))
        progressing = _B.c.status == "in_progress"
        async with self.engine.begin() as conn:
            done = await conn.execute(
                update(_B)
                .where(
                    _B.c.id == batch_id,
                    _B.c.status.in_(("in_progress", "finalizing", "cancelling")),
                    or_(_B.c.claimed_by.is_(None), _B.c.claimed_at < stale),
                    ~undone,
                )
                .values(
                    claimed_by=runner,
                    claimed_at=now,
                    status=case((progressing, "finalizing"), else_=_B.c.status),
                    finalizing_at=case((progressing, now), else_=_B.c.finalizing_at),
                )
            )
            if done.rowcount != 1:
                return None
            expired = (
                await conn.execute(
                    select(exists().where(_L.c.batch_id == batch_id, _L.c.status == "expired"))
                )
            ).scalar()
        got = await self.get(batch_id, None)
        assert got is not None
        final = (
            "cancelled" if got.status == "cancelling" else ("expired" if expired else "completed")
        )
        return got, final

    async def results(self, batch_id: str) -> tuple[list[str], list[str]]:
        """The output-file and error-file lines of ``batch_id``, in input order:
        completed lines' results; failed lines' results and a ``batch_expired`` line per
        expired line. Cancelled lines have none."""
        q = (
            select(_L.c.status, _L.c.custom_id, _L.c.result)
            .where(_L.c.batch_id == batch_id)
            .order_by(_L.c.line_no)
        )
        out: list[str] = []
        err: list[str] = []
        async with self.engine.connect() as conn:
            for status, custom_id, result in (await conn.execute(q)).all():
                if status == "completed":
                    out.append(result)
                elif status == "failed":
                    err.append(result)
                elif status == "expired":
                    err.append(expired_line(custom_id))
        return out, err

    async def close(
        self,
        batch_id: str,
        runner: str,
        final: str,
        output_file_id: str | None,
        error_file_id: str | None,
        now: datetime,
    ) -> bool:
        """End the batch ``runner`` is finalizing in ``final`` with its files; whether
        it still held the finalizing claim."""
        async with self.engine.begin() as conn:
            done = await conn.execute(
                update(_B)
                .where(_B.c.id == batch_id, _B.c.claimed_by == runner, _B.c.status.in_(OPEN))
                .values(
                    status=final,
                    output_file_id=output_file_id,
                    error_file_id=error_file_id,
                    claimed_by=None,
                    **{f"{final}_at": now},
                )
            )
        return done.rowcount == 1

    async def line_totals(self) -> dict[str, int]:
        """Lines of every batch by status (``pending``, ``running``, …)."""
        q = select(_L.c.status, func.count()).group_by(_L.c.status)
        async with self.engine.connect() as conn:
            return {str(s): int(n) for s, n in (await conn.execute(q)).all()}


def body_text(body: dict[str, Any]) -> str:
    """A line's body as stored (compact JSON text)."""
    return json.dumps(body, ensure_ascii=False, separators=(",", ":"))
