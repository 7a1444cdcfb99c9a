"""``audit_event.event_id``: a unique id per audit event, so a replay appends it once.

Revision ID: 0009_audit_event_id
Revises: 0008_record_rejected
Create Date: 2026-12-05

Each audit event carries an id from the moment it is emitted (a UUID, hex; kept in the
spill file with the event). The append skips an event whose id is already in the chain
(``ON CONFLICT (event_id) DO NOTHING``), so replaying a spill batch that committed just
before its ``<spill>.pos`` update was saved does not chain the same events twice. The id
is not part of the hashed content (the chain of existing rows is unchanged); rows written
before this revision have none (NULL, which the unique index allows any number of times).
"""

import sqlalchemy as sa
from alembic import op

revision = "0009_audit_event_id"
down_revision = "0008_record_rejected"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("audit_event", sa.Column("event_id", sa.String(64), nullable=True))
    op.create_index("ix_audit_event_event_id", "audit_event", ["event_id"], unique=True)


def downgrade() -> None:
    op.drop_index("ix_audit_event_event_id", table_name="audit_event")
    with op.batch_alter_table("audit_event") as batch:
        batch.drop_column("event_id")
