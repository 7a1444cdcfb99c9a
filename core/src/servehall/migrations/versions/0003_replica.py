"""request_log.replica (which servehall replica served the request) and the
``v_requests_per_replica_day`` view.

Revision ID: 0003_replica
Revises: 0002_records
Create Date: 2026-11-30

Several replicas may share one database (docs/deploy.md); each row names its replica
(``[server] replica``, default ``<hostname>-<pid>``). Rows written before this revision
have ``replica`` NULL. The views of 0002 group by day/tenant/status/model over every
row, so they already aggregate across replicas; the new view splits per replica:

* ``v_requests_per_replica_day`` — requests, errors and tokens per UTC day and replica.
"""

import sqlalchemy as sa
from alembic import op

revision = "0003_replica"
down_revision = "0002_records"
branch_labels = None
depends_on = None


def _day(dialect: str) -> str:
    if dialect == "postgresql":
        return "CAST(received_at AT TIME ZONE 'UTC' AS DATE)"
    return "date(received_at)"


def _view(dialect: str) -> str:
    day = _day(dialect)
    return f"""
        SELECT {day} AS day,
               replica,
               COUNT(*) AS requests,
               SUM(CASE WHEN status_code < 400 THEN 1 ELSE 0 END) AS ok_requests,
               SUM(CASE WHEN status_code >= 400 THEN 1 ELSE 0 END) AS error_requests,
               SUM(prompt_tokens + completion_tokens) AS total_tokens
        FROM request_log
        GROUP BY {day}, replica
    """


def upgrade() -> None:
    op.add_column("request_log", sa.Column("replica", sa.String(128), nullable=True))
    op.create_index(
        "ix_request_log_replica_received_at", "request_log", ["replica", "received_at"]
    )
    dialect = op.get_context().dialect.name
    op.execute(f"CREATE VIEW v_requests_per_replica_day AS {_view(dialect)}")


def downgrade() -> None:
    op.execute("DROP VIEW IF EXISTS v_requests_per_replica_day")
    op.drop_index("ix_request_log_replica_received_at", table_name="request_log")
    op.drop_column("request_log", "replica")  # SQLite >= 3.35 drops columns natively
