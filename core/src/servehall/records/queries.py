"""Named queries for ``servehall audit query NAME`` (the documented SQL views).

Each name maps to a view (or table) and the column ``--since`` filters on. Rows come
back as plain Python values (dates as ISO strings, numerics as int/float).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import date, datetime
from decimal import Decimal
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from servehall.errors import ConfigError
from servehall.records.codec import iso_utc, parse_iso


@dataclass(frozen=True, slots=True)
class NamedQuery:
    """A query NAME: the relation it reads, its time column and sort order."""

    name: str
    relation: str
    since_column: str
    since_is_date: bool
    order_by: str
    description: str


QUERIES: dict[str, NamedQuery] = {
    q.name: q
    for q in (
        NamedQuery(
            "requests_per_tenant_day",
            "v_requests_per_tenant_day",
            "day",
            True,
            "day, tenant",
            "requests and tokens per UTC day and tenant",
        ),
        NamedQuery(
            "error_rate_by_status",
            "v_error_rate_by_status",
            "day",
            True,
            "day, status_code",
            "requests per UTC day and HTTP status, with the share of the day's requests",
        ),
        NamedQuery(
            "latency_by_model",
            "v_latency_by_model",
            "day",
            True,
            "day, model",
            "latency and TTFT percentiles (seconds) per UTC day and model",
        ),
        NamedQuery(
            "requests_per_replica_day",
            "v_requests_per_replica_day",
            "day",
            True,
            "day, replica",
            "requests, errors and tokens per UTC day and replica (several replicas may "
            "share one database)",
        ),
        NamedQuery(
            "audit_events",
            "audit_event",
            "at",
            False,
            "id",
            "the audit trail (id, at, actor, action, target, details)",
        ),
    )
}
"""Every NAME ``servehall audit query`` accepts (a ``v_`` prefix is allowed too)."""


def find_query(name: str) -> NamedQuery:
    """The query called ``name`` (or ``v_<name>``); ConfigError listing the names."""
    key = name.removeprefix("v_").replace("-", "_")
    if key not in QUERIES:
        raise ConfigError(f"unknown query {name!r}; known: {', '.join(sorted(QUERIES))}")
    return QUERIES[key]


def parse_since(value: str) -> datetime:
    """``--since``: ``YYYY-MM-DD`` or an ISO-8601 time (UTC when no offset)."""
    try:
        return parse_iso(value)
    except ValueError:
        raise ConfigError(f"--since {value!r}: use YYYY-MM-DD or an ISO-8601 time") from None


def _plain(value: Any) -> Any:
    if isinstance(value, Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    if isinstance(value, datetime):
        return iso_utc(value)
    if isinstance(value, date):
        return value.isoformat()
    return value


async def run_query(
    engine: AsyncEngine, name: str, since: datetime | None = None, limit: int | None = None
) -> tuple[list[str], list[dict[str, Any]]]:
    """Run the named query; ``(column names, rows as dicts)``.

    Raises:
        ConfigError: unknown NAME.
    """
    q = find_query(name)
    sql = f"SELECT * FROM {q.relation}"
    params: dict[str, Any] = {}
    pg = engine.dialect.name == "postgresql"
    if since is not None:
        sql += f" WHERE {q.since_column} >= :since"
        if q.since_is_date:
            params["since"] = since.date() if pg else since.date().isoformat()
        else:
            naive = since.replace(tzinfo=None)
            params["since"] = since if pg else naive.strftime("%Y-%m-%d %H:%M:%S.%f")
    sql += f" ORDER BY {q.order_by}"
    if limit is not None:
        sql += f" LIMIT {int(limit)}"
    async with engine.connect() as conn:
        result = await conn.execute(text(sql), params)
        cols = list(result.keys())
        rows = [{c: _plain(v) for c, v in zip(cols, row, strict=True)} for row in result.all()]
    for row in rows:
        if isinstance(row.get("details"), str):  # SQLite returns JSON columns as text here
            row["details"] = json.loads(row["details"])
    return cols, rows
