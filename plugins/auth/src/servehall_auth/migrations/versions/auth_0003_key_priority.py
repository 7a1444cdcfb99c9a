"""auth: api_key.priority and api_key.max_priority, a key's own scheduling priority.

Revision ID: auth_0003_key_priority
Revises: auth_0002_pepper_fp
Create Date: 2026-11-30

Used by ``[scheduler] policy = "priority"``: ``priority`` is the key's default priority
(NULL or 0: its tenant's ``[auth.tenants.<name>] priority``), ``max_priority`` the highest
a request made with the key may ask for (NULL: its tenant's ``max_priority``). Both are
integers in [-1000, 1000]. Existing keys get NULL: nothing changes for them.
"""

import sqlalchemy as sa
from alembic import op

revision = "auth_0003_key_priority"
down_revision = "auth_0002_pepper_fp"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("api_key", sa.Column("priority", sa.Integer, nullable=True))
    op.add_column("api_key", sa.Column("max_priority", sa.Integer, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("api_key") as batch:
        batch.drop_column("max_priority")
        batch.drop_column("priority")
