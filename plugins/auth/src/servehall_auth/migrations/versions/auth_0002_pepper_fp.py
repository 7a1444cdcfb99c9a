"""auth: api_key.pepper_fp, the fingerprint of the pepper each key was made with.

Revision ID: auth_0002_pepper_fp
Revises: auth_0001_api_key
Create Date: 2026-11-30

``pepper_fp`` = the first 16 hex characters of HMAC-SHA-256(pepper, "servehall-auth
pepper fingerprint v1") (:func:`servehall_auth.keys.pepper_fingerprint`): it identifies
the pepper without revealing it, so ``servehall serve`` can warn at start when no active
key was made with the configured pepper. NULL for keys made before this revision.
"""

import sqlalchemy as sa
from alembic import op

revision = "auth_0002_pepper_fp"
down_revision = "auth_0001_api_key"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("api_key", sa.Column("pepper_fp", sa.String(16), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("api_key") as batch:
        batch.drop_column("pepper_fp")
