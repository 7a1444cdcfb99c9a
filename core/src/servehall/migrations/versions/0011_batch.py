"""``batch`` and ``batch_line`` (``/v1/batches``); ``request_log.batch_id`` and
``custom_id``.

Revision ID: 0011_batch
Revises: 0010_file_object
Create Date: 2026-12-07

A batch's row (OpenAI's batch object: status and its times, the input, output and error
files, the owner and the principal its lines run as, the finalizing runner's lease) and
one row per line (its body, status, claim, attempt, HTTP status and output-file line);
a request record names the batch and ``custom_id`` of the line it ran
(:mod:`servehall.batches`; docs/api.md, "Batches").
"""

import sqlalchemy as sa
from alembic import op

revision = "0011_batch"
down_revision = "0010_file_object"
branch_labels = None
depends_on = None

TS = sa.DateTime(timezone=True)
BIGID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "batch",
        sa.Column("seq", BIGID, nullable=False, autoincrement=True),
        sa.Column("id", sa.String(64), nullable=False),
        sa.Column("owner", sa.String(128), nullable=False),
        sa.Column("principal", sa.JSON(), nullable=False),
        sa.Column("endpoint", sa.String(64), nullable=False),
        sa.Column("input_file_id", sa.String(64), nullable=False),
        sa.Column("completion_window", sa.String(16), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("metadata", sa.JSON(), nullable=True),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("expires_at", TS, nullable=False),
        sa.Column("in_progress_at", TS, nullable=True),
        sa.Column("finalizing_at", TS, nullable=True),
        sa.Column("completed_at", TS, nullable=True),
        sa.Column("failed_at", TS, nullable=True),
        sa.Column("expired_at", TS, nullable=True),
        sa.Column("cancelling_at", TS, nullable=True),
        sa.Column("cancelled_at", TS, nullable=True),
        sa.Column("output_file_id", sa.String(64), nullable=True),
        sa.Column("error_file_id", sa.String(64), nullable=True),
        sa.Column("claimed_by", sa.String(128), nullable=True),
        sa.Column("claimed_at", TS, nullable=True),
        sa.PrimaryKeyConstraint("seq", name="pk_batch"),
        sa.UniqueConstraint("id", name="uq_batch_id"),
    )
    op.create_index("ix_batch_owner_seq", "batch", ["owner", "seq"])
    op.create_index("ix_batch_status", "batch", ["status"])
    op.create_table(
        "batch_line",
        sa.Column("seq", BIGID, nullable=False, autoincrement=True),
        sa.Column("batch_id", sa.String(64), nullable=False),
        sa.Column("line_no", sa.Integer(), nullable=False),
        sa.Column("custom_id", sa.String(512), nullable=False),
        sa.Column("body", sa.Text(), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("claimed_by", sa.String(128), nullable=True),
        sa.Column("claimed_at", TS, nullable=True),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("request_id", sa.String(128), nullable=True),
        sa.Column("status_code", sa.Integer(), nullable=True),
        sa.Column("result", sa.Text(), nullable=True),
        sa.Column("finished_at", TS, nullable=True),
        sa.PrimaryKeyConstraint("seq", name="pk_batch_line"),
        sa.UniqueConstraint("batch_id", "custom_id", name="uq_batch_line_batch_id_custom_id"),
    )
    op.create_index("ix_batch_line_status_batch_id", "batch_line", ["status", "batch_id"])
    op.add_column("request_log", sa.Column("batch_id", sa.String(64), nullable=True))
    op.add_column("request_log", sa.Column("custom_id", sa.String(512), nullable=True))
    op.create_index("ix_request_log_batch_id", "request_log", ["batch_id"])


def downgrade() -> None:
    op.drop_index("ix_request_log_batch_id", table_name="request_log")
    with op.batch_alter_table("request_log") as t:
        t.drop_column("custom_id")
        t.drop_column("batch_id")
    op.drop_index("ix_batch_line_status_batch_id", table_name="batch_line")
    op.drop_table("batch_line")
    op.drop_index("ix_batch_status", table_name="batch")
    op.drop_index("ix_batch_owner_seq", table_name="batch")
    op.drop_table("batch")
