"""Alembic environment (placeholder until the records layer lands: runs offline/online
against SERVEHALL_DATABASE__URL with a sync engine)."""

import os

from alembic import context
from sqlalchemy import create_engine

url = os.environ.get("SERVEHALL_DATABASE__URL", "sqlite:///servehall.db").replace(
    "+aiosqlite", ""
).replace("+asyncpg", "+psycopg")

if context.is_offline_mode():
    context.configure(url=url, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()
else:
    with create_engine(url).connect() as conn:
        context.configure(connection=conn)
        with context.begin_transaction():
            context.run_migrations()
