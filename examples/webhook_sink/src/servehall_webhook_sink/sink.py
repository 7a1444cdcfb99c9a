"""The ``webhook`` record sink: POST each request record to ``[webhook_sink] url``.

Each :class:`~servehall.RequestRecord` becomes one ``POST`` with a JSON body
(:func:`record_payload`); audit events are not sent. Failed tries (timeout, connection
error, 5xx, 429) are retried with exponential backoff up to ``max_attempts``; the outcome
of every record — delivered or not, tries, last status or error — is written to the
``webhook_delivery`` table of the deployment database. A record that could not be
delivered is recorded as such and not retried again (the sink never blocks the core's
record queue on a dead webhook): the records of a batch are posted concurrently, up to
``concurrency`` at a time, so a dead webhook costs one record's tries per batch.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import httpx
from sqlalchemy.ext.asyncio import AsyncEngine

from servehall import RequestRecord, create_db_engine
from servehall_webhook_sink.settings import WebhookSettings
from servehall_webhook_sink.table import webhook_delivery

log = logging.getLogger("servehall_webhook_sink")

RETRY_STATUS = frozenset({408, 425, 429, 500, 502, 503, 504})


def record_payload(record: RequestRecord) -> dict[str, Any]:
    """The JSON body posted for ``record``: its fields, times as ISO 8601 strings."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(record):
        value = getattr(record, f.name)
        out[f.name] = value.isoformat() if isinstance(value, datetime) else value
    return out


class WebhookSink:
    """A :class:`servehall.Sink` posting request records to a webhook.

    Args:
        settings: the ``[webhook_sink]`` section.
        database_url: where ``webhook_delivery`` lives (``[database] url``).
        client: an ``httpx.AsyncClient`` to use (tests); one is made otherwise.
    """

    name = "webhook"
    required = False

    def __init__(
        self,
        settings: WebhookSettings,
        database_url: str,
        client: httpx.AsyncClient | None = None,
    ) -> None:
        self.settings = settings
        self.url = str(settings.url)
        self.database_url = database_url
        self._client = client
        self._own_client = client is None
        self._engine: AsyncEngine | None = None

    async def start(self) -> None:
        """Open the HTTP client and the database engine."""
        if self._client is None:
            limits = httpx.Limits(max_connections=self.settings.concurrency)
            self._client = httpx.AsyncClient(timeout=self.settings.timeout_s, limits=limits)
        self._engine = create_db_engine(self.database_url)

    async def write(self, records: Sequence[Any]) -> None:
        """Post the batch's request records concurrently (at most ``concurrency`` at a
        time), then record the outcomes (one transaction). A dead webhook costs a batch
        about one record's tries (``max_attempts`` × ``timeout_s`` plus backoff), not that
        much per record. Raises only when the database write fails (the core retries)."""
        gate = asyncio.Semaphore(self.settings.concurrency)

        async def one(rec: RequestRecord) -> dict[str, Any]:
            async with gate:
                return await self._deliver(rec)

        rows = list(
            await asyncio.gather(*(one(r) for r in records if isinstance(r, RequestRecord)))
        )
        if rows and self._engine is not None:
            async with self._engine.begin() as conn:
                await conn.execute(webhook_delivery.insert(), rows)

    async def _deliver(self, rec: RequestRecord) -> dict[str, Any]:
        assert self._client is not None
        body = record_payload(rec)
        status: int | None = None
        error: str | None = None
        attempt = 0
        for attempt in range(1, self.settings.max_attempts + 1):
            try:
                resp = await self._client.post(self.url, json=body)
                status, error = resp.status_code, None
                if resp.is_success or status not in RETRY_STATUS:
                    break
            except httpx.HTTPError as exc:
                status, error = None, f"{type(exc).__name__}: {exc}"[:500]
            if attempt < self.settings.max_attempts:
                await asyncio.sleep(self.settings.backoff_s * 2 ** (attempt - 1))
        delivered = status is not None and 200 <= status < 300
        if not delivered:
            log.warning("webhook: record %s not delivered after %d tries", rec.request_id, attempt)
        return {
            "request_id": rec.request_id,
            "url": self.url,
            "delivered": delivered,
            "attempts": attempt,
            "status_code": status,
            "error": error,
            "at": datetime.now(UTC),
        }

    async def close(self) -> None:
        """Close the client (if this sink made it) and the engine. Idempotent."""
        if self._client is not None and self._own_client:
            await self._client.aclose()
            self._client = None
        if self._engine is not None:
            await self._engine.dispose()
            self._engine = None
