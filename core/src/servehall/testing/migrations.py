"""Conformance kit for plugin migrations: does a branch create exactly its tables?

A plugin's test runs :func:`schema_diff` on an empty SQLite file and an empty
PostgreSQL database and asserts an empty list::

    from servehall.testing.migrations import schema_diff
    from servehall_myplugin.plugin import servehall_migrations

    async def test_migration_matches_tables(tmp_path):
        url = f"sqlite+aiosqlite:///{tmp_path / 'x.db'}"
        assert await schema_diff(url, servehall_migrations()) == []

It applies the core's revisions and the given branches (as ``servehall db upgrade``
does), then runs Alembic's autogenerate comparison against the core's table definitions
plus each branch's ``metadata()``: any table, column, type, nullability or index the
revisions create differently from the code's definitions shows up as a difference.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from servehall.plugin.migrations import MigrationBranch

__all__ = ["schema_diff"]


async def schema_diff(url: str, branches: Sequence[MigrationBranch] = ()) -> list[Any]:
    """Migrate the (empty) database at ``url`` and return autogenerate's differences.

    Args:
        url: an async SQLAlchemy URL (``sqlite+aiosqlite://…``, ``postgresql+asyncpg://…``).
        branches: plugin branches to apply and compare (each needs ``metadata``).

    Returns:
        Alembic's ``compare_metadata`` diff list; empty means the migrations match.
    """
    from alembic.autogenerate import compare_metadata
    from alembic.runtime.migration import MigrationContext

    from servehall.db.engine import create_db_engine
    from servehall.db.migrate import upgrade_database
    from servehall.db.models import DbBase

    metadatas = [DbBase.metadata, *(b.metadata() for b in branches if b.metadata is not None)]
    engine = create_db_engine(url)
    try:
        await upgrade_database(engine, branches)

        def compare(conn: Any) -> list[Any]:
            ctx = MigrationContext.configure(
                conn,
                opts={
                    "compare_type": True,
                    "target_metadata": metadatas,
                    "include_name": lambda name, type_, parent: (
                        not (type_ == "table" and name == "alembic_version")
                    ),
                },
            )
            return list(compare_metadata(ctx, metadatas))  # type: ignore[arg-type]

        async with engine.connect() as conn:
            return await conn.run_sync(compare)
    finally:
        await engine.dispose()
