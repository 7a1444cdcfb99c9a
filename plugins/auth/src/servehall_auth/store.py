"""The ``api_key`` table and the async key store (SQLAlchemy 2, SQLite and PostgreSQL).

The table is created by the Alembic revision ``auth_0001_api_key`` (branch ``auth``,
shipped in ``servehall_auth/migrations/versions``); :data:`api_key` mirrors it for
queries, and a test checks the two agree (autogenerate finds no difference). Only
hashes are stored (see :mod:`servehall_auth.keys`): ``secret_hash`` for the current
secret and, during a rotation's overlap window, ``prev_secret_hash`` valid until
``prev_valid_until``.
Times are timezone-aware UTC.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from servehall import (
    ConfigError,
    DbTimeouts,
    Limits,
    Policy,
    Principal,
    UTCDateTime,
    create_db_engine,
)
from servehall_auth.keys import (
    format_key,
    hash_key,
    new_key_id,
    new_secret,
    pepper_fingerprint,
    public_id,
    verify_key,
)
from servehall_auth.settings import PRIORITY_LIMIT

metadata = sa.MetaData()

api_key = sa.Table(
    "api_key",
    metadata,
    sa.Column("key_id", sa.String(16), nullable=False),
    sa.Column("secret_hash", sa.String(64), nullable=False),
    sa.Column("prev_secret_hash", sa.String(64), nullable=True),
    sa.Column("prev_valid_until", UTCDateTime, nullable=True),
    sa.Column("name", sa.String(200), nullable=True),
    sa.Column("tenant", sa.String(200), nullable=False),
    sa.Column("scopes", sa.JSON, nullable=False),
    sa.Column("models", sa.JSON, nullable=True),
    sa.Column("rpm", sa.Integer, nullable=True),
    sa.Column("tpm", sa.Integer, nullable=True),
    sa.Column("created_at", UTCDateTime, nullable=False),
    sa.Column("created_by", sa.String(200), nullable=True),
    sa.Column("expires_at", UTCDateTime, nullable=True),
    sa.Column("revoked_at", UTCDateTime, nullable=True),
    sa.Column("rotated_at", UTCDateTime, nullable=True),
    sa.Column("pepper_fp", sa.String(16), nullable=True),
    sa.Column("priority", sa.Integer, nullable=True),
    sa.Column("max_priority", sa.Integer, nullable=True),
    sa.PrimaryKeyConstraint("key_id", name="pk_api_key"),
    sa.Index("ix_api_key_tenant", "tenant"),
)
"""Mirror of the migrated ``api_key`` table (``pepper_fp`` since ``auth_0002_pepper_fp``)."""


@dataclass(frozen=True, slots=True)
class PepperReport:
    """How the active keys relate to the configured pepper (see :meth:`KeyStore.pepper_report`).

    ``active`` keys in all; ``known`` of them record the fingerprint of the pepper they
    were made with (keys older than ``auth_0002_pepper_fp`` do not); ``matching`` record
    the configured pepper's fingerprint.
    """

    active: int
    known: int
    matching: int

    @property
    def mismatch(self) -> bool:
        """True when keys with a known pepper exist and none was made with this one:
        every such key will be refused (the pepper was changed or lost)."""
        return self.known > 0 and self.matching == 0


def auth_metadata() -> sa.MetaData:
    """The ``MetaData`` of the auth plugin's tables (for the migration check)."""
    return metadata


def utcnow() -> datetime:
    """Now, timezone-aware UTC."""
    return datetime.now(UTC)


def _aware(dt: datetime | None) -> datetime | None:
    # SQLite returns naive datetimes; everything stored is UTC.
    if dt is None or dt.tzinfo is not None:
        return dt
    return dt.replace(tzinfo=UTC)


def _utc(dt: datetime | None) -> datetime | None:
    # Given times: naive means UTC; aware ones are converted to UTC.
    if dt is None:
        return None
    return dt.replace(tzinfo=UTC) if dt.tzinfo is None else dt.astimezone(UTC)


AUDITED_KEY_FIELDS = (
    "tenant",
    "name",
    "scopes",
    "models",
    "rpm",
    "tpm",
    "priority",
    "max_priority",
    "expires_at",
)
"""The :meth:`KeyRecord.as_dict` fields a ``key.created`` audit event carries."""


@dataclass(frozen=True, slots=True)
class KeyRecord:
    """One API key's settings (never its secret or hash).

    ``models`` None means every model. ``status(now)`` is ``active``, ``expired`` or
    ``revoked``. ``priority`` (None: the tenant's default) and ``max_priority``
    (None: the tenant's) are the key's own scheduling priority and request ceiling
    (``[scheduler] policy = "priority"``).
    """

    key_id: str
    tenant: str
    name: str | None
    scopes: tuple[str, ...]
    models: tuple[str, ...] | None
    rpm: int | None
    tpm: int | None
    created_at: datetime
    created_by: str | None
    expires_at: datetime | None
    revoked_at: datetime | None
    rotated_at: datetime | None
    prev_valid_until: datetime | None
    priority: int | None = None
    max_priority: int | None = None

    @property
    def public_id(self) -> str:
        """``sh-<key_id>``."""
        return public_id(self.key_id)

    def status(self, now: datetime | None = None) -> str:
        """``revoked``, ``expired`` or ``active``."""
        now = now or utcnow()
        if self.revoked_at is not None:
            return "revoked"
        if self.expires_at is not None and self.expires_at <= now:
            return "expired"
        return "active"

    def principal(self) -> Principal:
        """The principal this key authenticates as (its tenant's policy is added by
        :meth:`AuthRuntime.authenticate`)."""
        return Principal(
            id=self.public_id,
            tenant=self.tenant,
            kind="api_key",
            name=self.name,
            policy=Policy(
                scopes=frozenset(self.scopes),
                models=frozenset(self.models) if self.models is not None else None,
                limits=Limits(rpm=self.rpm or None, tpm=self.tpm or None),
                priority=self.priority,
                max_priority=self.max_priority,
            ),
        )

    def as_dict(self, now: datetime | None = None) -> dict[str, Any]:
        """JSON-able view (times as ISO 8601 strings) for the CLI and admin API."""

        def iso(dt: datetime | None) -> str | None:
            return dt.isoformat() if dt else None

        return {
            "id": self.public_id,
            "key_id": self.key_id,
            "tenant": self.tenant,
            "name": self.name,
            "scopes": list(self.scopes),
            "models": list(self.models) if self.models is not None else None,
            "rpm": self.rpm,
            "tpm": self.tpm,
            "priority": self.priority,
            "max_priority": self.max_priority,
            "created_at": iso(self.created_at),
            "created_by": self.created_by,
            "expires_at": iso(self.expires_at),
            "revoked_at": iso(self.revoked_at),
            "rotated_at": iso(self.rotated_at),
            "previous_secret_valid_until": iso(self.prev_valid_until),
            "status": self.status(now),
        }


@dataclass(frozen=True, slots=True)
class _Row:
    record: KeyRecord
    secret_hash: str
    prev_secret_hash: str | None


def _row(m: Any) -> _Row:
    rec = KeyRecord(
        key_id=m["key_id"],
        tenant=m["tenant"],
        name=m["name"],
        scopes=tuple(m["scopes"] or ()),
        models=tuple(m["models"]) if m["models"] is not None else None,
        rpm=m["rpm"],
        tpm=m["tpm"],
        created_at=_aware(m["created_at"]) or utcnow(),
        created_by=m["created_by"],
        expires_at=_aware(m["expires_at"]),
        revoked_at=_aware(m["revoked_at"]),
        rotated_at=_aware(m["rotated_at"]),
        prev_valid_until=_aware(m["prev_valid_until"]),
        priority=m["priority"],
        max_priority=m["max_priority"],
    )
    return _Row(rec, m["secret_hash"], m["prev_secret_hash"])


class KeyNotFoundError(LookupError):
    """No key with that id."""


def make_engine(url: str, timeouts: DbTimeouts | None = None) -> AsyncEngine:
    """An async engine for ``url`` (``sqlite+aiosqlite://`` or ``postgresql+asyncpg://``),
    made by the records layer's :func:`servehall.create_db_engine` (SQLite in WAL mode
    with a busy timeout; PostgreSQL connections pre-pinged).

    ``timeouts``: the ``[database]`` bounds (:class:`servehall.DbTimeouts`: statement,
    lock and idle-in-transaction timeouts on each PostgreSQL session, and a connect
    timeout); with them a connection from the pool is also waited for at most
    ``command_s`` seconds. None: no bounds (tools and tests).

    Raises:
        ConfigError: the URL does not parse or names an unsupported driver.
    """
    if timeouts is None:
        return create_db_engine(url)
    pool: dict[str, float] = {}
    if timeouts.command_s > 0 and not url.startswith("sqlite"):
        pool["pool_timeout"] = timeouts.command_s
    return create_db_engine(url, timeouts=timeouts, **pool)


class KeyStore:
    """Create, list, revoke, rotate and verify API keys.

    Args:
        engine: async engine on the deployment database (migrated: ``api_key`` exists).
        pepper: the server-side secret mixed into hashes (never stored).
        cache_ttl_s: how long :meth:`verify` may reuse a fetched row (0: never). Changes
            made through this store drop the row at once; changes made elsewhere (the
            CLI, another replica) are seen within this many seconds — or at once when
            they are broadcast (:mod:`servehall_auth.broadcast`).
        cache_size: most rows cached.
        lookup_timeout_s: the longest :meth:`verify` waits for the database (seconds;
            0: no limit): past it, it raises :class:`TimeoutError` (the caller answers
            503) while the lookup itself ends on the engine's own timeouts. Concurrent
            lookups of one key share one query.

    Attributes:
        on_change: awaited with the bare key id after a revocation or rotation commits
            (the runtime sets it to the pub/sub broadcast when ``limits_url`` is set).
        cache_enabled: False makes :meth:`verify` read the database every time (set by
            the broadcast listener while it cannot listen).
    """

    def __init__(
        self,
        engine: AsyncEngine,
        pepper: str,
        *,
        cache_ttl_s: float = 0.0,
        cache_size: int = 10_000,
        lookup_timeout_s: float = 0.0,
    ) -> None:
        self.engine = engine
        self._pepper = pepper
        self.pepper_fp = pepper_fingerprint(pepper)
        self._ttl = cache_ttl_s
        self._cache_size = cache_size
        self._cache: dict[str, tuple[float, _Row]] = {}
        self._lookup_timeout = lookup_timeout_s
        # one database lookup per (key id, generation) at a time, shared by its callers
        self._lookups: dict[tuple[str, int], asyncio.Task[_Row | None]] = {}
        # bumped by every forget: a row fetched before a forget is not cached after it
        self._generation = 0
        self.cache_enabled = True
        self.on_change: Callable[[str], Awaitable[object]] | None = None

    def __repr__(self) -> str:
        return f"KeyStore(engine={self.engine.url.render_as_string(hide_password=True)!r})"

    async def check_schema(self) -> None:
        """Raise ConfigError when the ``api_key`` table is missing or lacks a column this
        version reads (the database was not migrated after an upgrade: every key lookup
        would fail)."""

        def missing(conn: sa.Connection) -> list[str] | None:
            inspector = sa.inspect(conn)
            if not inspector.has_table("api_key"):
                return None
            have = {c["name"] for c in inspector.get_columns("api_key")}
            return [c.name for c in api_key.columns if c.name not in have]

        async with self.engine.connect() as conn:
            absent = await conn.run_sync(missing)
        migrate = "migrate the database first (servehall db upgrade, or alembic upgrade heads)"
        if absent is None:
            raise ConfigError(f"auth: table api_key does not exist; {migrate}")
        if absent:
            raise ConfigError(f"auth: table api_key lacks column(s) {', '.join(absent)}; {migrate}")

    async def create(
        self,
        *,
        tenant: str,
        name: str | None = None,
        scopes: list[str] | tuple[str, ...] = ("inference",),
        models: list[str] | tuple[str, ...] | None = None,
        rpm: int | None = None,
        tpm: int | None = None,
        expires_at: datetime | None = None,
        created_by: str | None = None,
        priority: int | None = None,
        max_priority: int | None = None,
    ) -> tuple[KeyRecord, str]:
        """Create a key; returns its record and the full key text (shown once).

        ``priority`` / ``max_priority``: the key's own scheduling priority and request
        ceiling (see :class:`KeyRecord`), integers in [-1000, 1000].

        Raises:
            ValueError: a priority outside [-1000, 1000].
        """
        for label, value in (("priority", priority), ("max_priority", max_priority)):
            if value is not None and not -PRIORITY_LIMIT <= value <= PRIORITY_LIMIT:
                raise ValueError(f"{label} must be in [-1000, 1000], got {value}")
        now = utcnow()
        expires_at = _utc(expires_at)
        for _ in range(5):
            key_id = new_key_id()
            key = format_key(key_id, new_secret())
            values = {
                "key_id": key_id,
                "secret_hash": hash_key(key, self._pepper),
                "prev_secret_hash": None,
                "prev_valid_until": None,
                "name": name,
                "tenant": tenant,
                "scopes": sorted(set(scopes)),
                "models": sorted(set(models)) if models is not None else None,
                "rpm": rpm,
                "tpm": tpm,
                "created_at": now,
                "created_by": created_by,
                "expires_at": expires_at,
                "revoked_at": None,
                "rotated_at": None,
                "pepper_fp": self.pepper_fp,
                "priority": priority,
                "max_priority": max_priority,
            }
            try:
                async with self.engine.begin() as conn:
                    await conn.execute(api_key.insert().values(**values))
            except sa.exc.IntegrityError:
                continue  # key id collision (2^-50 per pair); draw again
            return _row(values).record, key
        raise RuntimeError("could not draw a unique key id")

    async def pepper_report(self, now: datetime | None = None) -> PepperReport:
        """Count the active (not revoked, not expired) keys, those that record a pepper
        fingerprint, and those whose fingerprint is this store's pepper's."""
        now = now or utcnow()
        active = sa.and_(
            api_key.c.revoked_at.is_(None),
            sa.or_(api_key.c.expires_at.is_(None), api_key.c.expires_at > now),
        )
        q = sa.select(
            sa.func.count(),
            sa.func.count(api_key.c.pepper_fp),
            sa.func.coalesce(
                sa.func.sum(sa.case((api_key.c.pepper_fp == self.pepper_fp, 1), else_=0)), 0
            ),
        ).where(active)
        async with self.engine.connect() as conn:
            total, known, matching = (await conn.execute(q)).one()
        return PepperReport(int(total), int(known), int(matching))

    async def _get_row(self, key_id: str) -> _Row | None:
        async with self.engine.connect() as conn:
            res = await conn.execute(sa.select(api_key).where(api_key.c.key_id == key_id))
            m = res.mappings().first()
        return _row(m) if m is not None else None

    async def get(self, key_id: str) -> KeyRecord:
        """The key's record. Raises KeyNotFoundError."""
        row = await self._get_row(key_id)
        if row is None:
            raise KeyNotFoundError(key_id)
        return row.record

    async def list(
        self, *, tenant: str | None = None, include_revoked: bool = False
    ) -> list[KeyRecord]:
        """Keys ordered by creation time, optionally of one tenant and with revoked ones."""
        q = sa.select(api_key).order_by(api_key.c.created_at, api_key.c.key_id)
        if tenant is not None:
            q = q.where(api_key.c.tenant == tenant)
        if not include_revoked:
            q = q.where(api_key.c.revoked_at.is_(None))
        async with self.engine.connect() as conn:
            res = await conn.execute(q)
            return [_row(m).record for m in res.mappings().all()]

    async def revoke(self, key_id: str) -> KeyRecord:
        """Revoke now (idempotent: an already revoked key keeps its first revocation time).

        Raises KeyNotFoundError."""
        self.forget(key_id)
        async with self.engine.begin() as conn:
            await conn.execute(
                api_key.update()
                .where(api_key.c.key_id == key_id, api_key.c.revoked_at.is_(None))
                .values(revoked_at=utcnow(), prev_secret_hash=None, prev_valid_until=None)
            )
        self.forget(key_id)
        await self._changed(key_id)
        return await self.get(key_id)

    async def _changed(self, key_id: str) -> None:
        from servehall_auth.metrics import KEY_CACHE_INVALIDATIONS

        KEY_CACHE_INVALIDATIONS.labels("local").inc()
        if self.on_change is not None:
            await self.on_change(key_id)

    async def rotate(self, key_id: str, overlap: timedelta = timedelta(0)) -> tuple[KeyRecord, str]:
        """Give the key a new secret; the old secret keeps working for ``overlap``.

        The key id, tenant, scopes, models and limits stay. A second rotation inside an
        overlap window ends the first window (only the latest previous secret is kept).

        Raises:
            KeyNotFoundError: no such key.
            ValueError: the key is revoked.
        """
        row = await self._get_row(key_id)
        if row is None:
            raise KeyNotFoundError(key_id)
        if row.record.revoked_at is not None:
            raise ValueError("a revoked key cannot be rotated")
        now = utcnow()
        key = format_key(key_id, new_secret())
        keep = overlap.total_seconds() > 0
        self.forget(key_id)
        async with self.engine.begin() as conn:
            await conn.execute(
                api_key.update()
                .where(api_key.c.key_id == key_id)
                .values(
                    secret_hash=hash_key(key, self._pepper),
                    prev_secret_hash=row.secret_hash if keep else None,
                    prev_valid_until=now + overlap if keep else None,
                    rotated_at=now,
                    pepper_fp=self.pepper_fp,
                )
            )
        self.forget(key_id)
        await self._changed(key_id)
        return await self.get(key_id), key

    async def verify(
        self, key_id: str, key: str, now: datetime | None = None
    ) -> tuple[str, KeyRecord | None]:
        """Check a presented key. Returns ``(outcome, record)``.

        ``outcome`` is ``ok``, ``ok_previous`` (the pre-rotation secret inside its overlap
        window), ``unknown_key``, ``bad_secret``, ``revoked`` or ``expired``; the record
        is returned only when the secret matched.

        Raises:
            TimeoutError: the database did not answer within ``lookup_timeout_s``.
            sqlalchemy.exc.SQLAlchemyError, OSError: the database failed.
        """
        row = await self._cached_row(key_id)
        return check(row, key, self._pepper, now or utcnow())

    async def _cached_row(self, key_id: str) -> _Row | None:
        if self._ttl <= 0 or not self.cache_enabled:
            return await self._lookup(key_id)
        t = time.monotonic()
        hit = self._cache.get(key_id)
        if hit is not None and t - hit[0] < self._ttl:
            return hit[1]
        generation = self._generation
        row = await self._lookup(key_id)
        if row is None:
            self._cache.pop(key_id, None)
            return None
        if generation != self._generation or not self.cache_enabled:
            return row  # invalidated while we read: use it once, do not keep it
        if len(self._cache) >= self._cache_size:
            self._cache.pop(next(iter(self._cache)))
        self._cache[key_id] = (t, row)
        return row

    async def _lookup(self, key_id: str) -> _Row | None:
        """:meth:`_get_row`, shared by concurrent callers of one key (until a forget) and
        waited for at most ``lookup_timeout_s``: a hung database makes the caller fail
        at that deadline, not at the end of the query, which is left to finish (or time
        out) on its own rather than being cancelled mid-protocol."""
        slot = (key_id, self._generation)
        task = self._lookups.get(slot)
        if task is None:
            task = asyncio.ensure_future(self._get_row(key_id))
            self._lookups[slot] = task
            task.add_done_callback(lambda t: self._lookup_done(slot, t))
        if self._lookup_timeout <= 0:
            return await asyncio.shield(task)
        async with asyncio.timeout(self._lookup_timeout):
            return await asyncio.shield(task)

    def _lookup_done(self, slot: tuple[str, int], task: asyncio.Task[_Row | None]) -> None:
        if self._lookups.get(slot) is task:
            del self._lookups[slot]
        if not task.cancelled():
            task.exception()  # retrieved: a lookup every caller gave up on is not an error

    def forget(self, key_id: str) -> None:
        """Drop a cached row (after a change)."""
        self._generation += 1
        self._cache.pop(key_id, None)

    def forget_all(self) -> None:
        """Drop every cached row."""
        self._generation += 1
        self._cache.clear()


def check(row: _Row | None, key: str, pepper: str, now: datetime) -> tuple[str, KeyRecord | None]:
    """The verification rule of :meth:`KeyStore.verify`, on an already fetched row."""
    if row is None:
        return "unknown_key", None
    outcome = "ok"
    if not verify_key(key, pepper, row.secret_hash):
        prev_ok = (
            row.prev_secret_hash is not None
            and row.record.prev_valid_until is not None
            and now < row.record.prev_valid_until
            and verify_key(key, pepper, row.prev_secret_hash)
        )
        if not prev_ok:
            return "bad_secret", None
        outcome = "ok_previous"
    status = row.record.status(now)
    if status != "active":
        return status, row.record
    return outcome, row.record


async def close_store(store: KeyStore) -> None:
    """Cancel the store's lookups still waiting on the database (their callers gave up)
    and dispose of its engine (its connection pool)."""
    for task in list(store._lookups.values()):
        task.cancel()
    await store.engine.dispose()
