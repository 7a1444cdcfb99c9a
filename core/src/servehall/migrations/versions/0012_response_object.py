"""``response_object``: stored responses of ``/v1/responses``.

Revision ID: 0012_response_object
Revises: 0011_batch
Create Date: 2026-12-03

One row per stored response (``store: true``): an ordering sequence, the public
``resp_…`` id (unique), the owner principal's id, when it was made and when it expires
(``[responses] retention_days``), the model name, the response object (JSON text) and
the conversation up to it (JSON text, the input a ``previous_response_id`` continues;
:mod:`servehall.responses.store`; docs/api.md, "Responses").
"""

import sqlalchemy as sa
from alembic import op

revision = "0012_response_object"
down_revision = "0011_batch"
branch_labels = None
depends_on = None

TS = sa.DateTime(timezone=True)
BIGID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "response_object",
        sa.Column("seq", BIGID, nullable=False, autoincrement=True),
        sa.Column("id", sa.String(64), nullable=False),
        sa.Column("owner", sa.String(128), nullable=False),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("expires_at", TS, nullable=False),
        sa.Column("model", sa.String(256), nullable=False),
        sa.Column("body", sa.Text(), nullable=False),
        sa.Column("input_items", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("seq", name="pk_response_object"),
        sa.UniqueConstraint("id", name="uq_response_object_id"),
    )
    op.create_index("ix_response_object_owner_seq", "response_object", ["owner", "seq"])
    op.create_index("ix_response_object_expires_at", "response_object", ["expires_at"])


def downgrade() -> None:
    op.drop_index("ix_response_object_expires_at", table_name="response_object")
    op.drop_index("ix_response_object_owner_seq", table_name="response_object")
    op.drop_table("response_object")
