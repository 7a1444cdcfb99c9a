"""Tests of servehall.db.models: the core tables on a real SQLite file — constraint names
from the naming convention, autoincrementing ids, column defaults and uniqueness.
(That the migrations build exactly these tables is ``test_migrations_match_tables.py``.)"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from sqlalchemy import Engine, create_engine, inspect, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from servehall.db.models import (
    NAMING_CONVENTION,
    AuditEventRow,
    BatchLine,
    DbBase,
    RecordRejected,
    RequestLog,
)

CORE_TABLES = {
    "request_log",
    "audit_event",
    "audit_chain_head",
    "audit_checkpoint",
    "record_rejected",
    "config_revision",
    "file_object",
    "batch",
    "batch_line",
    "response_object",
}

NOW = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[Engine]:
    eng = create_engine(f"sqlite:///{tmp_path / 'm.db'}")
    DbBase.metadata.create_all(eng, tables=[DbBase.metadata.tables[t] for t in CORE_TABLES])
    yield eng
    eng.dispose()


def test_the_core_tables_are_declared() -> None:
    assert set(DbBase.metadata.tables) >= CORE_TABLES
    for key, template in NAMING_CONVENTION.items():
        assert DbBase.metadata.naming_convention[key] == template


def test_constraint_and_index_names_follow_the_convention(engine: Engine) -> None:
    insp = inspect(engine)
    assert insp.get_pk_constraint("request_log")["name"] in ("pk_request_log", None)
    indexes = {ix["name"] for ix in insp.get_indexes("request_log")}
    assert {"ix_request_log_received_at", "ix_request_log_tenant_received_at"} <= indexes
    audit = {ix["name"]: ix["unique"] for ix in insp.get_indexes("audit_event")}
    assert audit["ix_audit_event_event_id"] in (1, True)
    uniques = {u["name"] for u in insp.get_unique_constraints("batch_line")}
    assert "uq_batch_line_batch_id_custom_id" in uniques
    assert "uq_record_rejected_sink_payload_sha256" in {
        u["name"] for u in insp.get_unique_constraints("record_rejected")
    }


def test_request_log_defaults(engine: Engine) -> None:
    with Session(engine) as s:
        s.add(RequestLog(request_id="r1", received_at=NOW, status_code=200))
        s.commit()
        row = s.get(RequestLog, "r1")
        assert row is not None
        assert (row.endpoint, row.prompt_tokens, row.completion_tokens, row.stream) == (
            "",
            0,
            0,
            False,
        )
        assert row.filter_verdicts == [] and row.tool_calls is None
        assert row.received_at == NOW  # UTC round trip


def _event(h: str, event_id: str | None) -> AuditEventRow:
    return AuditEventRow(
        at=NOW, actor="admin", action="config.apply", prev_hash="0" * 64, hash=h, event_id=event_id
    )


def test_audit_ids_autoincrement_and_hash_and_event_id_are_unique(engine: Engine) -> None:
    with Session(engine) as s:
        s.add_all([_event("a" * 64, "e1"), _event("b" * 64, None), _event("c" * 64, None)])
        s.commit()
        rows = s.scalars(select(AuditEventRow).order_by(AuditEventRow.id)).all()
        assert [r.id for r in rows] == [1, 2, 3]  # several NULL event ids are fine
        assert rows[0].details == {}
    for dup in (_event("a" * 64, "e9"), _event("d" * 64, "e1")):
        with Session(engine) as s, pytest.raises(IntegrityError):
            s.add(dup)
            s.commit()


def test_batch_line_custom_ids_are_unique_per_batch(engine: Engine) -> None:
    def line(batch: str, custom: str) -> BatchLine:
        return BatchLine(batch_id=batch, line_no=0, custom_id=custom, body="{}", status="pending")

    with Session(engine) as s:
        s.add_all([line("b1", "x"), line("b2", "x")])
        s.commit()
        assert s.scalars(select(BatchLine.attempt)).all() == [0, 0]
    with Session(engine) as s, pytest.raises(IntegrityError):
        s.add(line("b1", "x"))
        s.commit()


def test_record_rejected_dedups_per_sink_and_payload(engine: Engine) -> None:
    def rejected(sink: str, sha: str) -> RecordRejected:
        return RecordRejected(
            rejected_at=NOW, sink=sink, kind="request", payload="{}", payload_sha256=sha, error="e"
        )

    with Session(engine) as s:
        s.add_all([rejected("sql", "1" * 64), rejected("sql", "2" * 64), rejected("pg", "1" * 64)])
        s.commit()
    with Session(engine) as s, pytest.raises(IntegrityError):
        s.add(rejected("sql", "1" * 64))
        s.commit()
