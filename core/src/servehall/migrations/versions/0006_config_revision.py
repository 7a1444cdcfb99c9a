"""request_log.version (which version of a model served the request) and the
``config_revision`` table (every applied config, for history and rollback).

Revision ID: 0006_config_revision
Revises: 0005_tools
Create Date: 2026-12-01

* ``request_log.version`` — the ``[[models]] version`` label that served the request
  (NULL for rows before this revision and for unversioned models).
* ``config_revision`` — revision number (from 1), SHA-256 of the text, the config text
  as applied (secrets stay references), who applied it, when, and the unified diff
  against the previous revision (docs/versions.md).
"""

import sqlalchemy as sa
from alembic import op

revision = "0006_config_revision"
down_revision = "0005_tools"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("request_log", sa.Column("version", sa.String(64), nullable=True))
    op.create_table(
        "config_revision",
        sa.Column("revision", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("hash", sa.String(64), nullable=False),
        sa.Column("text", sa.Text(), nullable=False),
        sa.Column("fmt", sa.String(8), nullable=False),
        sa.Column("applied_by", sa.String(128), nullable=False),
        sa.Column("applied_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("diff", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("revision", name="pk_config_revision"),
    )
    op.create_index("ix_config_revision_applied_at", "config_revision", ["applied_at"])


def downgrade() -> None:
    op.drop_index("ix_config_revision_applied_at", table_name="config_revision")
    op.drop_table("config_revision")
    op.drop_column("request_log", "version")
