"""``servehall.db.types``: timestamps stored in UTC and read back timezone-aware, on a
real SQLite database."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import sqlalchemy as sa

from servehall.db.types import UTCDateTime, to_utc

T0 = datetime(2026, 3, 4, 5, 6, 7, 890123, tzinfo=UTC)


def test_to_utc() -> None:
    assert to_utc(T0.replace(tzinfo=None)) == T0
    assert to_utc(T0.astimezone(timezone(timedelta(hours=-5)))) == T0
    assert to_utc(T0).tzinfo is UTC


def test_round_trip_on_sqlite(tmp_path: Path) -> None:
    meta = sa.MetaData()
    table = sa.Table(
        "t",
        meta,
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("at", UTCDateTime(), nullable=True),
    )
    engine = sa.create_engine(f"sqlite:///{tmp_path / 't.db'}")
    meta.create_all(engine)
    plus2 = T0.astimezone(timezone(timedelta(hours=2)))
    with engine.begin() as conn:
        conn.execute(
            table.insert(),
            [
                {"id": 1, "at": plus2},
                {"id": 2, "at": T0.replace(tzinfo=None)},
                {"id": 3, "at": None},
            ],
        )
        stored = conn.execute(sa.text("SELECT at FROM t WHERE id = 1")).scalar_one()
        rows = dict(conn.execute(sa.select(table.c.id, table.c.at)).all())
    engine.dispose()
    assert stored.startswith("2026-03-04 05:06:07.890123")  # UTC text, no offset
    assert rows[1] == T0 and rows[1].tzinfo is not None
    assert rows[2] == T0
    assert rows[3] is None
