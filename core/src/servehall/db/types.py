"""Column types shared by core and plugin tables.

:class:`UTCDateTime` stores every timestamp in UTC on both databases: ``TIMESTAMP WITH
TIME ZONE`` on PostgreSQL, an ISO-like ``YYYY-MM-DD HH:MM:SS.ffffff`` text (UTC, no
offset) on SQLite. Naive datetimes are taken as UTC; results are always timezone-aware UTC.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import DateTime
from sqlalchemy.engine import Dialect
from sqlalchemy.types import TypeDecorator


def to_utc(value: datetime) -> datetime:
    """``value`` as an aware UTC datetime (naive values are taken as UTC already)."""
    if value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    return value.astimezone(UTC)


class UTCDateTime(TypeDecorator[datetime]):
    """A timezone-aware UTC timestamp column (see module docstring)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: Any, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        value = to_utc(value)
        if dialect.name == "sqlite":
            return value.replace(tzinfo=None)
        return value

    def process_result_value(self, value: Any, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return to_utc(value)
