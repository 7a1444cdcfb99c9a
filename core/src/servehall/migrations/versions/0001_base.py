"""base: the root of the migration tree (no tables).

Revision ID: 0001_base
Revises:
Create Date: 2026-11-29
"""

revision = "0001_base"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    pass


def downgrade() -> None:
    pass
