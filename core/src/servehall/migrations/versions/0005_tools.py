"""request_log.tool_calls: the names of the functions the model called.

Revision ID: 0005_tools
Revises: 0004_structured
Create Date: 2026-12-01

A JSON list of function names, every choice's calls in order (``["get_weather",
"get_time"]``); null for requests that offered no tools and for rows written before this
revision. The calls' arguments are never stored here: they are part of
``completion_text``, which is kept only when prompts are stored.
"""

import sqlalchemy as sa
from alembic import op

revision = "0005_tools"
down_revision = "0004_structured"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("request_log", sa.Column("tool_calls", sa.JSON(), nullable=True))


def downgrade() -> None:
    op.drop_column("request_log", "tool_calls")  # SQLite >= 3.35 drops columns natively
