"""``file_object``: the metadata of uploaded files (``/v1/files``).

Revision ID: 0010_file_object
Revises: 0009_audit_event_id
Create Date: 2026-12-06

One row per uploaded file: an ordering sequence (the list's cursor), the public
``file-…`` id (unique), the owner principal's id, the filename as uploaded, the purpose,
the size in bytes, when it was uploaded, the content's SHA-256 and the key the file store
keeps the content under (:mod:`servehall.files`; docs/api.md, "Files").
"""

import sqlalchemy as sa
from alembic import op

revision = "0010_file_object"
down_revision = "0009_audit_event_id"
branch_labels = None
depends_on = None

TS = sa.DateTime(timezone=True)
BIGID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "file_object",
        sa.Column("seq", BIGID, nullable=False, autoincrement=True),
        sa.Column("id", sa.String(64), nullable=False),
        sa.Column("owner", sa.String(128), nullable=False),
        sa.Column("filename", sa.String(512), nullable=False),
        sa.Column("purpose", sa.String(32), nullable=False),
        sa.Column("bytes", sa.BigInteger(), nullable=False),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("sha256", sa.String(64), nullable=False),
        sa.Column("storage_key", sa.String(256), nullable=False),
        sa.PrimaryKeyConstraint("seq", name="pk_file_object"),
        sa.UniqueConstraint("id", name="uq_file_object_id"),
    )
    op.create_index("ix_file_object_owner_seq", "file_object", ["owner", "seq"])


def downgrade() -> None:
    op.drop_index("ix_file_object_owner_seq", table_name="file_object")
    op.drop_table("file_object")
