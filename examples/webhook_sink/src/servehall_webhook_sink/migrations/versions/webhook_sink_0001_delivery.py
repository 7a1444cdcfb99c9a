"""webhook_sink: the webhook_delivery table (branch of the servehall-webhook-sink plugin).

Revision ID: webhook_sink_0001
Revises: 0001_base
Create Date: 2026-11-30
"""

import sqlalchemy as sa
from alembic import op

revision = "webhook_sink_0001"
down_revision = "0001_base"
branch_labels = ("webhook_sink",)
depends_on = None


def upgrade() -> None:
    op.create_table(
        "webhook_delivery",
        sa.Column("id", sa.Integer(), sa.Identity(), nullable=False),
        sa.Column("request_id", sa.String(100), nullable=False),
        sa.Column("url", sa.String(2000), nullable=False),
        sa.Column("delivered", sa.Boolean(), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("status_code", sa.Integer(), nullable=True),
        sa.Column("error", sa.String(500), nullable=True),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_webhook_delivery"),
    )
    op.create_index("ix_webhook_delivery_request_id", "webhook_delivery", ["request_id"])


def downgrade() -> None:
    op.drop_index("ix_webhook_delivery_request_id", table_name="webhook_delivery")
    op.drop_table("webhook_delivery")
