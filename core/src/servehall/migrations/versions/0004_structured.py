"""request_log.response_format: the structured-output kind a request asked for.

Revision ID: 0004_structured
Revises: 0003_replica
Create Date: 2026-12-01

``json_object``, ``json_schema``, ``regex``, ``choice`` or ``grammar`` (from
``response_format``, ``structured_outputs`` or the ``guided_*`` fields); NULL for free
text and for rows written before this revision.
"""

import sqlalchemy as sa
from alembic import op

revision = "0004_structured"
down_revision = "0003_replica"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("request_log", sa.Column("response_format", sa.String(32), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("request_log") as batch:
        batch.drop_column("response_format")
