"""Alembic environment for every servehall table (core and plugin-owned branches).

Shipped inside the ``servehall`` package; :mod:`servehall.db.migrate` points Alembic at
it and adds the ``versions`` directory of every plugin branch it applies.

How the connection is chosen, first match wins:

1. ``config.attributes["connection"]``: a sync connection handed in by servehall itself
   (``servehall db upgrade``, ``[database] auto_migrate``; it runs ``upgrade heads``
   inside ``AsyncConnection.run_sync``);
2. ``-x url=...`` or ``sqlalchemy.url`` in the Alembic config;
3. the servehall config: ``[database] url`` of ``$SERVEHALL_CONFIG``, overridden by
   ``SERVEHALL_DATABASE__URL``.

Online runs use an async engine (aiosqlite/asyncpg). Plugins add tables as their own
branches rooted at ``0001_base`` (see :class:`servehall.MigrationBranch`).
"""

from __future__ import annotations

import asyncio

from alembic import context
from sqlalchemy.engine import Connection

from servehall.db.models import DbBase

config = context.config
target_metadata = DbBase.metadata


def _url() -> str:
    x = context.get_x_argument(as_dictionary=True)
    if x.get("url"):
        return str(x["url"])
    url = config.get_main_option("sqlalchemy.url")
    if url:
        return url
    from servehall.config.settings import load_settings

    return load_settings().database.url.get_secret_value()


def _configure(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )


def run_offline() -> None:
    context.configure(url=_url(), target_metadata=target_metadata, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()


def _run_sync(connection: Connection) -> None:
    _configure(connection)
    with context.begin_transaction():
        context.run_migrations()


async def _run_async() -> None:
    from servehall.db.engine import create_db_engine

    engine = create_db_engine(_url())
    try:
        async with engine.begin() as conn:
            await conn.run_sync(_run_sync)
    finally:
        await engine.dispose()


def run_online() -> None:
    given = config.attributes.get("connection")
    if given is not None:
        _run_sync(given)
    else:
        asyncio.run(_run_async())


if context.is_offline_mode():
    run_offline()
else:
    run_online()
