"""Stored responses (``store: true`` on ``/v1/responses``): the ``response_object`` table
of the records database.

Every call names the owner: a response is found only by the principal that made it, so
another principal's id reads exactly like an unknown one. A row lives
``[responses] retention_days``; an expired row is invisible and is deleted when a new
one is stored.

The database is ``[database] url``, opened on first use with its schema checked (and
migrated with ``[database] auto_migrate``), as :mod:`servehall.files.service` does. A
database that cannot be reached or is not migrated makes each call a 503
``responses_unavailable`` (never a 500); the next call tries again.
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from sqlalchemy import Table, delete, insert, select
from sqlalchemy.ext.asyncio import AsyncEngine

from servehall.db.models import ResponseObject
from servehall.errors import ServehallError, ServiceUnavailableError

if TYPE_CHECKING:
    from servehall.config.settings import Settings

log = logging.getLogger("servehall.responses")

_T: Table = ResponseObject.__table__  # type: ignore[assignment]
UNAVAILABLE = "responses_unavailable"


def unavailable(why: str) -> ServiceUnavailableError:
    """The 503 of a call the database cannot serve now."""
    return ServiceUnavailableError(
        f"Response storage is unavailable: {why}",
        code=UNAVAILABLE,
        headers={"Retry-After": "5"},
    )


@dataclass(frozen=True, slots=True)
class StoredResponse:
    """One stored response: ``body`` the response object, ``input_items`` the plain
    input items of the conversation up to it (see
    :func:`servehall.api.responses_translate.input_items`)."""

    id: str
    owner: str
    body: dict[str, Any]
    input_items: list[dict[str, Any]]


class ResponseStore:
    """See the module docstring. ``plugins`` (a
    :class:`~servehall.plugin.manager.PluginHost`, or None) names the migration branches
    the schema check includes."""

    def __init__(self, settings: Settings, plugins: Any = None) -> None:
        self.settings = settings
        self.plugins = plugins
        self._engine: AsyncEngine | None = None
        self._lock = asyncio.Lock()

    @property
    def enabled(self) -> bool:
        """Whether responses are stored at all (``[responses] store``)."""
        return self.settings.responses.store

    async def engine(self) -> AsyncEngine:
        """The database engine, made and its schema checked on first use.

        Raises:
            ServiceUnavailableError: 503 ``responses_unavailable``.
        """
        if self._engine is not None:
            return self._engine
        async with self._lock:
            if self._engine is None:
                self._engine = await self._open()
        return self._engine

    async def _open(self) -> AsyncEngine:
        from servehall.db.migrate import open_checked

        try:
            engine = await open_checked(self.settings, self.plugins)
        except ServehallError as exc:  # ConfigError, PluginError
            log.warning("responses: %s", exc.message)
            raise unavailable(exc.message) from None
        return engine

    async def put(
        self, owner: str, body: dict[str, Any], input_items: list[dict[str, Any]]
    ) -> None:
        """Store ``body`` (its ``id`` must be new) and the conversation up to it; purge
        expired rows."""
        engine = await self.engine()
        now = datetime.now(UTC)
        values = {
            "id": body["id"],
            "owner": owner,
            "created_at": now,
            "expires_at": now + timedelta(days=self.settings.responses.retention_days),
            "model": str(body.get("model", ""))[:256],
            "body": json.dumps(body, ensure_ascii=False),
            "input_items": json.dumps(input_items, ensure_ascii=False),
        }
        try:
            async with engine.begin() as conn:
                await conn.execute(delete(_T).where(_T.c.expires_at <= now))
                await conn.execute(insert(_T).values(**values))
        except Exception as exc:
            log.warning("responses: storing %s failed: %s", body["id"], type(exc).__name__)
            raise unavailable("the database refused the write") from None

    async def get(self, response_id: str, owner: str) -> StoredResponse | None:
        """The unexpired response ``response_id`` when ``owner`` made it, else None."""
        engine = await self.engine()
        q = select(_T.c.body, _T.c.input_items).where(
            _T.c.id == response_id, _T.c.owner == owner, _T.c.expires_at > datetime.now(UTC)
        )
        try:
            async with engine.connect() as conn:
                r = (await conn.execute(q)).first()
        except Exception as exc:
            log.warning("responses: reading %s failed: %s", response_id, type(exc).__name__)
            raise unavailable("the database did not answer") from None
        if r is None:
            return None
        return StoredResponse(response_id, owner, json.loads(r.body), json.loads(r.input_items))

    async def remove(self, response_id: str, owner: str) -> bool:
        """Delete the response ``response_id`` when ``owner`` made it; whether it was
        there (and unexpired)."""
        engine = await self.engine()
        cond = (
            (_T.c.id == response_id) & (_T.c.owner == owner) & (_T.c.expires_at > datetime.now(UTC))
        )
        try:
            async with engine.begin() as conn:
                found = (await conn.execute(select(_T.c.seq).where(cond))).first()
                if found is not None:
                    await conn.execute(delete(_T).where(_T.c.seq == found.seq))
        except Exception as exc:
            log.warning("responses: deleting %s failed: %s", response_id, type(exc).__name__)
            raise unavailable("the database did not answer") from None
        return found is not None

    async def close(self) -> None:
        """Dispose of the database engine (when one was opened)."""
        if self._engine is not None:
            await self._engine.dispose()
            self._engine = None
