"""The ``webhook_delivery`` table: one row per request record the sink tried to post.

Created by the revision ``webhook_sink_0001`` (branch ``webhook_sink``, in
``servehall_webhook_sink/migrations/versions``); :data:`webhook_delivery` mirrors it and
the plugin's test checks the two agree.
"""

from __future__ import annotations

import sqlalchemy as sa

from servehall import UTCDateTime

metadata = sa.MetaData()

webhook_delivery = sa.Table(
    "webhook_delivery",
    metadata,
    sa.Column("id", sa.Integer, sa.Identity(), nullable=False),
    sa.Column("request_id", sa.String(100), nullable=False),
    sa.Column("url", sa.String(2000), nullable=False),
    sa.Column("delivered", sa.Boolean, nullable=False),
    sa.Column("attempts", sa.Integer, nullable=False),
    sa.Column("status_code", sa.Integer, nullable=True),
    sa.Column("error", sa.String(500), nullable=True),
    sa.Column("at", UTCDateTime, nullable=False),
    sa.PrimaryKeyConstraint("id", name="pk_webhook_delivery"),
    sa.Index("ix_webhook_delivery_request_id", "request_id"),
)
"""Mirror of the migrated ``webhook_delivery`` table (times UTC)."""


def webhook_metadata() -> sa.MetaData:
    """The plugin's ``MetaData`` (for the migration check)."""
    return metadata
