"""``audit_checkpoint``: Ed25519-signed checkpoints of the audit chain head.

Revision ID: 0007_audit_checkpoint
Revises: 0006_config_revision
Create Date: 2026-12-02

One row per checkpoint: when it was signed, the head it signs (``last_id``, ``events``,
``last_hash``), the signing key's id (SHA-256 hex of the raw public key) and the
signature (hex). See :mod:`servehall.records.checkpoint`.
"""

import sqlalchemy as sa
from alembic import op

revision = "0007_audit_checkpoint"
down_revision = "0006_config_revision"
branch_labels = None
depends_on = None

TS = sa.DateTime(timezone=True)
BIGID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "audit_checkpoint",
        sa.Column("id", BIGID, nullable=False, autoincrement=True),
        sa.Column("at", TS, nullable=False),
        sa.Column("last_id", sa.BigInteger(), nullable=False),
        sa.Column("events", sa.BigInteger(), nullable=False),
        sa.Column("last_hash", sa.String(64), nullable=False),
        sa.Column("key_id", sa.String(64), nullable=False),
        sa.Column("signature", sa.String(128), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_audit_checkpoint"),
    )
    op.create_index("ix_audit_checkpoint_last_id", "audit_checkpoint", ["last_id"])


def downgrade() -> None:
    op.drop_index("ix_audit_checkpoint_last_id", table_name="audit_checkpoint")
    op.drop_table("audit_checkpoint")
