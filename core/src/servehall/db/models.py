"""SQLAlchemy 2 models of the core's tables (the schema migrations create them).

Core tables: ``request_log`` (one row per request), ``audit_event`` (hash-chained admin
and security events), ``audit_chain_head`` (one row: the chain's last hash, so a
truncated tail is detected), ``file_object`` (uploaded files' metadata), ``batch`` and
``batch_line`` (``/v1/batches``: batches and their lines' progress) and
``record_rejected`` (records quarantined because the
database refused their content). Units: times UTC, durations seconds, tokens counts.

Plugin-owned tables are defined by the plugin (a ``MetaData`` of its own, or subclasses
of :class:`DbBase`, exported as ``servehall.DbBase``, for its constraint naming
convention); their Alembic revisions ship in the plugin's package as a branch rooted at
``0001_base``, declared with ``servehall_migrations`` (see ``docs/plugins.md``).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Float,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from servehall.db.types import UTCDateTime

NAMING_CONVENTION: dict[str, str] = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}
"""Constraint names used by every servehall table (stable names make migrations portable)."""

#: BIGINT on PostgreSQL, INTEGER (the rowid alias, so it autoincrements) on SQLite.
BigId = BigInteger().with_variant(Integer(), "sqlite")


class DbBase(DeclarativeBase):
    """Declarative base for core and plugin tables (shared ``metadata``)."""

    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class RequestLog(DbBase):
    """``request_log``: one row per HTTP inference request, whatever its outcome."""

    __tablename__ = "request_log"

    request_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    received_at: Mapped[datetime] = mapped_column(UTCDateTime())
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    principal_id: Mapped[str | None] = mapped_column(String(128))
    tenant: Mapped[str | None] = mapped_column(String(128))
    model: Mapped[str | None] = mapped_column(String(256))
    backend: Mapped[str | None] = mapped_column(String(64))
    endpoint: Mapped[str] = mapped_column(String(256), default="")
    status_code: Mapped[int] = mapped_column(Integer)
    error_code: Mapped[str | None] = mapped_column(String(128))
    finish_reason: Mapped[str | None] = mapped_column(String(64))
    prompt_tokens: Mapped[int] = mapped_column(Integer, default=0)
    completion_tokens: Mapped[int] = mapped_column(Integer, default=0)
    queue_time_s: Mapped[float | None] = mapped_column(Float)
    ttft_s: Mapped[float | None] = mapped_column(Float)
    latency_s: Mapped[float | None] = mapped_column(Float)
    stream: Mapped[bool] = mapped_column(Boolean, default=False)
    client_addr: Mapped[str | None] = mapped_column(String(128))
    filter_verdicts: Mapped[list[dict[str, Any]]] = mapped_column(JSON, default=list)
    prompt_text: Mapped[str | None] = mapped_column(Text)
    completion_text: Mapped[str | None] = mapped_column(Text)
    replica: Mapped[str | None] = mapped_column(String(128))
    # structured output: json_object | json_schema | regex | choice | grammar (NULL = text)
    response_format: Mapped[str | None] = mapped_column(String(32))
    tool_calls: Mapped[list[str] | None] = mapped_column(JSON)
    version: Mapped[str | None] = mapped_column(String(64))
    # a batch line's request (``/v1/batches``): the batch's id and the line's custom_id
    batch_id: Mapped[str | None] = mapped_column(String(64))
    custom_id: Mapped[str | None] = mapped_column(String(512))

    __table_args__ = (
        Index(None, "received_at"),
        Index(None, "batch_id"),
        Index(None, "tenant", "received_at"),
        Index(None, "model", "received_at"),
        Index(None, "status_code", "received_at"),
        Index(None, "principal_id", "received_at"),
        Index(None, "replica", "received_at"),
    )


class AuditEventRow(DbBase):
    """``audit_event``: hash-chained admin/security events (``servehall audit verify``).

    ``hash`` = SHA-256 hex of ``prev_hash`` + canonical JSON of (at, actor, action,
    target, details); see :mod:`servehall.records.chain`.
    """

    __tablename__ = "audit_event"

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    at: Mapped[datetime] = mapped_column(UTCDateTime())
    actor: Mapped[str] = mapped_column(String(128))
    action: Mapped[str] = mapped_column(String(128))
    target: Mapped[str | None] = mapped_column(String(256))
    details: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    prev_hash: Mapped[str] = mapped_column(String(64))
    hash: Mapped[str] = mapped_column(String(64), unique=True)
    #: The event's own id (``AuditEvent.event_id``; NULL on rows written before
    #: migration 0009): an append skips an id already stored, so a replayed batch is
    #: chained once. Not part of the hashed content.
    event_id: Mapped[str | None] = mapped_column(String(64))

    __table_args__ = (
        Index(None, "at"),
        Index(None, "action", "at"),
        Index(None, "event_id", unique=True),
    )


class AuditChainHead(DbBase):
    """``audit_chain_head``: exactly one row (id 1) holding the chain's tail.

    Writers lock this row first, which serialises chain appends across processes.
    """

    __tablename__ = "audit_chain_head"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    last_id: Mapped[int] = mapped_column(BigInteger, default=0)
    last_hash: Mapped[str] = mapped_column(String(64))
    events: Mapped[int] = mapped_column(BigInteger, default=0)


class AuditCheckpoint(DbBase):
    """``audit_checkpoint``: Ed25519 signatures over the audit chain head.

    Each row signs (``last_id``, ``events``, ``last_hash``, ``at``) — the head as it
    was — with the ``[audit] signing_key``, which is not in the database; ``key_id`` is
    the SHA-256 hex of the raw public key. See :mod:`servehall.records.checkpoint`.
    """

    __tablename__ = "audit_checkpoint"

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    at: Mapped[datetime] = mapped_column(UTCDateTime())
    last_id: Mapped[int] = mapped_column(BigInteger)
    events: Mapped[int] = mapped_column(BigInteger)
    last_hash: Mapped[str] = mapped_column(String(64))
    key_id: Mapped[str] = mapped_column(String(64))
    signature: Mapped[str] = mapped_column(String(128))

    __table_args__ = (Index(None, "last_id"),)


class RecordRejected(DbBase):
    """``record_rejected``: records a sink could not write, each kept alone with why.

    A record the database refuses for its content (while it accepts others) is
    quarantined here rather than retried forever or dropped
    (:mod:`servehall.records.runner`): ``sink`` is the sink's name, ``kind``
    ``request`` or ``audit`` (``line`` for an unreadable spill-file line),
    ``request_id`` the request's id (NULL for audit events), ``payload`` the record's
    JSON-lines form (the spill file's), ``error`` the database's error, ``payload_sha256``
    the SHA-256 hex of ``payload`` (unique per sink: a record quarantined again on a
    replay is kept once).
    """

    __tablename__ = "record_rejected"

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    rejected_at: Mapped[datetime] = mapped_column(UTCDateTime())
    sink: Mapped[str] = mapped_column(String(128))
    kind: Mapped[str] = mapped_column(String(16))
    request_id: Mapped[str | None] = mapped_column(String(128))
    payload: Mapped[str] = mapped_column(Text)
    payload_sha256: Mapped[str] = mapped_column(String(64))
    error: Mapped[str] = mapped_column(Text)

    __table_args__ = (
        Index(None, "rejected_at"),
        Index(None, "request_id"),
        UniqueConstraint("sink", "payload_sha256"),
    )


GENESIS_HASH = "0" * 64
"""``prev_hash`` of the first audit event."""


class ConfigRevision(DbBase):
    """``config_revision``: every config applied to the deployment (live or at start).

    ``revision`` counts up from 1; ``hash`` is the SHA-256 hex of ``text``; ``text`` is
    the config file as applied (TOML or YAML; secrets stay the ``{ env = ... }`` /
    ``{ file = ... }`` references the file holds, never their values); ``applied_by``
    names the principal or ``cli:<user>``; ``diff`` is the unified diff against the
    previous revision (empty for the first). See :mod:`servehall.rollout.revisions`.
    """

    __tablename__ = "config_revision"

    revision: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    hash: Mapped[str] = mapped_column(String(64))
    text: Mapped[str] = mapped_column(Text)
    fmt: Mapped[str] = mapped_column(String(8), default="toml")
    applied_by: Mapped[str] = mapped_column(String(128))
    applied_at: Mapped[datetime] = mapped_column(UTCDateTime())
    diff: Mapped[str] = mapped_column(Text, default="")

    __table_args__ = (Index(None, "applied_at"),)


class FileObject(DbBase):
    """``file_object``: one uploaded file (``/v1/files``), its content in a file store.

    ``seq`` orders files (the list's cursor); ``id`` is the public ``file-…`` id;
    ``owner`` the id of the principal that uploaded it (only it sees the file);
    ``filename`` as uploaded; ``purpose`` (``batch``); ``bytes`` the content's size;
    ``sha256`` its SHA-256 hex; ``storage_key`` where the store keeps it
    (:mod:`servehall.files.store`).
    """

    __tablename__ = "file_object"

    seq: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    id: Mapped[str] = mapped_column(String(64))
    owner: Mapped[str] = mapped_column(String(128))
    filename: Mapped[str] = mapped_column(String(512))
    purpose: Mapped[str] = mapped_column(String(32))
    bytes: Mapped[int] = mapped_column(BigInteger)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    sha256: Mapped[str] = mapped_column(String(64))
    storage_key: Mapped[str] = mapped_column(String(256))

    __table_args__ = (UniqueConstraint("id"), Index(None, "owner", "seq"))


class BatchRow(DbBase):
    """``batch``: one batch (``/v1/batches``); its lines are ``batch_line`` rows.

    ``seq`` orders batches (the list's cursor); ``id`` is the public ``batch_…`` id;
    ``owner`` the principal that created it (only it sees the batch) and ``principal``
    that principal as it was at creation (JSON: the identity and policy its lines run
    with); ``status`` one of OpenAI's (``validating``, ``in_progress``, ``finalizing``,
    ``completed``, ``failed``, ``expired``, ``cancelling``, ``cancelled``) with the time
    it entered each (``*_at``); ``output_file_id`` / ``error_file_id`` the result files
    (``file_object`` rows of purpose ``batch_output``); ``claimed_by`` / ``claimed_at``
    the runner finalizing it (a lease, see :mod:`servehall.batches.store`).
    """

    __tablename__ = "batch"

    seq: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    id: Mapped[str] = mapped_column(String(64))
    owner: Mapped[str] = mapped_column(String(128))
    principal: Mapped[dict[str, Any]] = mapped_column(JSON)
    endpoint: Mapped[str] = mapped_column(String(64))
    input_file_id: Mapped[str] = mapped_column(String(64))
    completion_window: Mapped[str] = mapped_column(String(16))
    status: Mapped[str] = mapped_column(String(16))
    batch_metadata: Mapped[dict[str, Any] | None] = mapped_column("metadata", JSON)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime())
    in_progress_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    finalizing_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    completed_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    failed_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    expired_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    cancelling_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    cancelled_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    output_file_id: Mapped[str | None] = mapped_column(String(64))
    error_file_id: Mapped[str | None] = mapped_column(String(64))
    claimed_by: Mapped[str | None] = mapped_column(String(128))
    claimed_at: Mapped[datetime | None] = mapped_column(UTCDateTime())

    __table_args__ = (UniqueConstraint("id"), Index(None, "owner", "seq"), Index(None, "status"))


class BatchLine(DbBase):
    """``batch_line``: one request of a batch and its progress.

    ``line_no`` is its 1-based line in the input file; ``body`` the request body (JSON
    text); ``status`` ``pending``, ``running`` (claimed by the runner ``claimed_by`` at
    ``claimed_at``, renewed while it runs), ``completed`` / ``failed`` (``result`` holds
    its output-file line, ``status_code`` the HTTP status), ``expired`` or
    ``cancelled``; ``attempt`` counts its claims; ``request_id`` the request that ran it
    (``request_log.request_id``).
    """

    __tablename__ = "batch_line"

    seq: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    batch_id: Mapped[str] = mapped_column(String(64))
    line_no: Mapped[int] = mapped_column(Integer)
    custom_id: Mapped[str] = mapped_column(String(512))
    body: Mapped[str] = mapped_column(Text)
    status: Mapped[str] = mapped_column(String(16))
    claimed_by: Mapped[str | None] = mapped_column(String(128))
    claimed_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    attempt: Mapped[int] = mapped_column(Integer, default=0)
    request_id: Mapped[str | None] = mapped_column(String(128))
    status_code: Mapped[int | None] = mapped_column(Integer)
    result: Mapped[str | None] = mapped_column(Text)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime())

    __table_args__ = (
        UniqueConstraint("batch_id", "custom_id"),
        Index(None, "status", "batch_id"),
    )


class ResponseObject(DbBase):
    """``response_object``: one stored response of ``/v1/responses`` (``store: true``).

    ``seq`` orders rows; ``id`` is the public ``resp_…`` id; ``owner`` the id of the
    principal that made it (only it sees the response); ``created_at`` / ``expires_at``
    (UTC; ``[responses] retention_days`` later; an expired row is invisible and purged);
    ``model`` the model name asked for; ``body`` the response object as JSON text;
    ``input_items`` the conversation up to this response (the previous responses' input
    and output, then this request's input) as a JSON list of plain items, which a later
    ``previous_response_id`` continues.
    """

    __tablename__ = "response_object"

    seq: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    id: Mapped[str] = mapped_column(String(64))
    owner: Mapped[str] = mapped_column(String(128))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime())
    model: Mapped[str] = mapped_column(String(256))
    body: Mapped[str] = mapped_column(Text)
    input_items: Mapped[str] = mapped_column(Text)

    __table_args__ = (
        UniqueConstraint("id"),
        Index(None, "owner", "seq"),
        Index(None, "expires_at"),
    )
