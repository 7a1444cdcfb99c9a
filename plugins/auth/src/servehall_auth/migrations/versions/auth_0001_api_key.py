"""auth: the api_key table (auth plugin branch).

Revision ID: auth_0001_api_key
Revises: 0001_base
Create Date: 2026-11-29

One row per API key; only HMAC-SHA-256(pepper, key) hashes are stored, never a key.
``prev_secret_hash`` / ``prev_valid_until`` keep the previous secret valid during a
rotation's overlap window. ``scopes`` is a JSON list; ``models`` a JSON list or NULL
(every model). ``rpm``/``tpm`` are per-minute limits (NULL: the [auth] defaults).
Times are UTC.
"""

import sqlalchemy as sa
from alembic import op

revision = "auth_0001_api_key"
down_revision = "0001_base"
branch_labels = ("auth",)
depends_on = None

TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "api_key",
        sa.Column("key_id", sa.String(16), nullable=False),
        sa.Column("secret_hash", sa.String(64), nullable=False),
        sa.Column("prev_secret_hash", sa.String(64), nullable=True),
        sa.Column("prev_valid_until", TS, nullable=True),
        sa.Column("name", sa.String(200), nullable=True),
        sa.Column("tenant", sa.String(200), nullable=False),
        sa.Column("scopes", sa.JSON(), nullable=False),
        sa.Column("models", sa.JSON(), nullable=True),
        sa.Column("rpm", sa.Integer(), nullable=True),
        sa.Column("tpm", sa.Integer(), nullable=True),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("created_by", sa.String(200), nullable=True),
        sa.Column("expires_at", TS, nullable=True),
        sa.Column("revoked_at", TS, nullable=True),
        sa.Column("rotated_at", TS, nullable=True),
        sa.PrimaryKeyConstraint("key_id", name="pk_api_key"),
    )
    op.create_index("ix_api_key_tenant", "api_key", ["tenant"])


def downgrade() -> None:
    op.drop_index("ix_api_key_tenant", table_name="api_key")
    op.drop_table("api_key")
