"""records: request_log, audit_event (hash chain), audit_chain_head, and the SQL views.

Revision ID: 0002_records
Revises: 0001_base
Create Date: 2026-11-29

Views (documented in docs/sql.md), one definition per dialect:

* ``v_requests_per_tenant_day`` — requests and tokens per UTC day and tenant;
* ``v_error_rate_by_status`` — requests per UTC day and HTTP status, with the share of
  that day's requests;
* ``v_latency_by_model`` — latency and TTFT percentiles per UTC day and model, over
  successful requests (status < 400). PostgreSQL: ``percentile_cont`` (linear
  interpolation). SQLite has no ordered-set aggregates: nearest-rank percentiles (the
  smallest value whose rank is at least p × n) computed with window functions.
"""

import sqlalchemy as sa
from alembic import op

revision = "0002_records"
down_revision = "0001_base"
branch_labels = None
depends_on = None

GENESIS = "0" * 64

TS = sa.DateTime(timezone=True)
BIGID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")

_PCTS = (("p50", 0.5), ("p90", 0.9), ("p99", 0.99))


def _day(dialect: str) -> str:
    if dialect == "postgresql":
        return "CAST(received_at AT TIME ZONE 'UTC' AS DATE)"
    return "date(received_at)"


def _views(dialect: str) -> dict[str, str]:
    day = _day(dialect)
    views = {
        "v_requests_per_tenant_day": f"""
            SELECT {day} AS day,
                   tenant,
                   COUNT(*) AS requests,
                   SUM(CASE WHEN status_code < 400 THEN 1 ELSE 0 END) AS ok_requests,
                   SUM(CASE WHEN status_code >= 400 THEN 1 ELSE 0 END) AS error_requests,
                   SUM(prompt_tokens) AS prompt_tokens,
                   SUM(completion_tokens) AS completion_tokens,
                   SUM(prompt_tokens + completion_tokens) AS total_tokens
            FROM request_log
            GROUP BY {day}, tenant
        """,
        "v_error_rate_by_status": f"""
            SELECT day, status_code, requests,
                   CAST(requests AS DOUBLE PRECISION)
                     / CAST(SUM(requests) OVER (PARTITION BY day) AS DOUBLE PRECISION)
                     AS share
            FROM (SELECT {day} AS day, status_code, COUNT(*) AS requests
                  FROM request_log GROUP BY {day}, status_code) AS per_status
        """,
    }
    if dialect == "postgresql":
        lat = ",\n".join(
            f"percentile_cont({p}) WITHIN GROUP (ORDER BY latency_s) AS latency_{n}_s"
            for n, p in _PCTS
        )
        ttft = ",\n".join(
            f"percentile_cont({p}) WITHIN GROUP (ORDER BY ttft_s) AS ttft_{n}_s"
            for n, p in _PCTS
        )
        views["v_latency_by_model"] = f"""
            SELECT {day} AS day, model, COUNT(*) AS requests,
                   {lat},
                   {ttft}
            FROM request_log
            WHERE status_code < 400 AND latency_s IS NOT NULL
            GROUP BY {day}, model
        """
    else:
        lat = ",\n".join(
            f"MIN(CASE WHEN rn >= {p} * n THEN latency_s END) AS latency_{n}_s"
            for n, p in _PCTS
        )
        ttft = ",\n".join(
            f"MIN(CASE WHEN rn >= {p} * n THEN ttft_s END) AS ttft_{n}_s" for n, p in _PCTS
        )
        tcols = ", ".join(f"t.ttft_{n}_s" for n, _ in _PCTS)
        lcols = ", ".join(f"l.latency_{n}_s" for n, _ in _PCTS)
        views["v_latency_by_model"] = f"""
            WITH base AS (
                SELECT {day} AS day, model, latency_s, ttft_s FROM request_log
                WHERE status_code < 400 AND latency_s IS NOT NULL
            ),
            lat AS (
                SELECT day, model, latency_s,
                       ROW_NUMBER() OVER (PARTITION BY day, model ORDER BY latency_s) AS rn,
                       COUNT(*) OVER (PARTITION BY day, model) AS n
                FROM base
            ),
            tt AS (
                SELECT day, model, ttft_s,
                       ROW_NUMBER() OVER (PARTITION BY day, model ORDER BY ttft_s) AS rn,
                       COUNT(*) OVER (PARTITION BY day, model) AS n
                FROM base WHERE ttft_s IS NOT NULL
            ),
            l AS (SELECT day, model, MAX(n) AS requests, {lat} FROM lat GROUP BY day, model),
            t AS (SELECT day, model, {ttft} FROM tt GROUP BY day, model)
            SELECT l.day AS day, l.model AS model, l.requests AS requests, {lcols}, {tcols}
            FROM l LEFT JOIN t ON t.day = l.day AND t.model IS l.model
        """
    return views


def upgrade() -> None:
    op.create_table(
        "request_log",
        sa.Column("request_id", sa.String(128), nullable=False),
        sa.Column("received_at", TS, nullable=False),
        sa.Column("finished_at", TS, nullable=True),
        sa.Column("principal_id", sa.String(128), nullable=True),
        sa.Column("tenant", sa.String(128), nullable=True),
        sa.Column("model", sa.String(256), nullable=True),
        sa.Column("backend", sa.String(64), nullable=True),
        sa.Column("endpoint", sa.String(256), nullable=False),
        sa.Column("status_code", sa.Integer(), nullable=False),
        sa.Column("error_code", sa.String(128), nullable=True),
        sa.Column("finish_reason", sa.String(64), nullable=True),
        sa.Column("prompt_tokens", sa.Integer(), nullable=False),
        sa.Column("completion_tokens", sa.Integer(), nullable=False),
        sa.Column("queue_time_s", sa.Float(), nullable=True),
        sa.Column("ttft_s", sa.Float(), nullable=True),
        sa.Column("latency_s", sa.Float(), nullable=True),
        sa.Column("stream", sa.Boolean(), nullable=False),
        sa.Column("client_addr", sa.String(128), nullable=True),
        sa.Column("filter_verdicts", sa.JSON(), nullable=False),
        sa.Column("prompt_text", sa.Text(), nullable=True),
        sa.Column("completion_text", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("request_id", name="pk_request_log"),
    )
    op.create_index("ix_request_log_received_at", "request_log", ["received_at"])
    op.create_index("ix_request_log_tenant_received_at", "request_log", ["tenant", "received_at"])
    op.create_index("ix_request_log_model_received_at", "request_log", ["model", "received_at"])
    op.create_index(
        "ix_request_log_status_code_received_at", "request_log", ["status_code", "received_at"]
    )
    op.create_index(
        "ix_request_log_principal_id_received_at", "request_log", ["principal_id", "received_at"]
    )

    op.create_table(
        "audit_event",
        sa.Column("id", BIGID, nullable=False, autoincrement=True),
        sa.Column("at", TS, nullable=False),
        sa.Column("actor", sa.String(128), nullable=False),
        sa.Column("action", sa.String(128), nullable=False),
        sa.Column("target", sa.String(256), nullable=True),
        sa.Column("details", sa.JSON(), nullable=False),
        sa.Column("prev_hash", sa.String(64), nullable=False),
        sa.Column("hash", sa.String(64), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_audit_event"),
        sa.UniqueConstraint("hash", name="uq_audit_event_hash"),
    )
    op.create_index("ix_audit_event_at", "audit_event", ["at"])
    op.create_index("ix_audit_event_action_at", "audit_event", ["action", "at"])

    head = op.create_table(
        "audit_chain_head",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("last_id", sa.BigInteger(), nullable=False),
        sa.Column("last_hash", sa.String(64), nullable=False),
        sa.Column("events", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_audit_chain_head"),
    )
    op.bulk_insert(head, [{"id": 1, "last_id": 0, "last_hash": GENESIS, "events": 0}])

    dialect = op.get_context().dialect.name
    for name, sql in _views(dialect).items():
        op.execute(f"CREATE VIEW {name} AS {sql}")


def downgrade() -> None:
    for name in _views(op.get_context().dialect.name):
        op.execute(f"DROP VIEW IF EXISTS {name}")
    op.drop_table("audit_chain_head")
    op.drop_index("ix_audit_event_action_at", table_name="audit_event")
    op.drop_index("ix_audit_event_at", table_name="audit_event")
    op.drop_table("audit_event")
    for ix in (
        "ix_request_log_principal_id_received_at",
        "ix_request_log_status_code_received_at",
        "ix_request_log_model_received_at",
        "ix_request_log_tenant_received_at",
        "ix_request_log_received_at",
    ):
        op.drop_index(ix, table_name="request_log")
    op.drop_table("request_log")
