"""``record_rejected``: records a sink could not write, quarantined with the error.

Revision ID: 0008_record_rejected
Revises: 0007_audit_checkpoint
Create Date: 2026-12-04

One row per record the database refused for its content while it accepted the rest of
the batch: when, which sink, ``request`` or ``audit`` (``line`` for an unreadable
spill-file line), the request id, the record's JSON-lines form, its SHA-256 (unique per
sink, so a replay never keeps it twice) and the database's error. See
:mod:`servehall.records.runner` and docs/sql.md.
"""

import sqlalchemy as sa
from alembic import op

revision = "0008_record_rejected"
down_revision = "0007_audit_checkpoint"
branch_labels = None
depends_on = None

TS = sa.DateTime(timezone=True)
BIGID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "record_rejected",
        sa.Column("id", BIGID, nullable=False, autoincrement=True),
        sa.Column("rejected_at", TS, nullable=False),
        sa.Column("sink", sa.String(128), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("request_id", sa.String(128), nullable=True),
        sa.Column("payload", sa.Text(), nullable=False),
        sa.Column("payload_sha256", sa.String(64), nullable=False),
        sa.Column("error", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_record_rejected"),
        sa.UniqueConstraint("sink", "payload_sha256", name="uq_record_rejected_sink_payload_sha256"),
    )
    op.create_index("ix_record_rejected_rejected_at", "record_rejected", ["rejected_at"])
    op.create_index("ix_record_rejected_request_id", "record_rejected", ["request_id"])


def downgrade() -> None:
    op.drop_index("ix_record_rejected_request_id", table_name="record_rejected")
    op.drop_index("ix_record_rejected_rejected_at", table_name="record_rejected")
    op.drop_table("record_rejected")
