"""``servehall.records.codec``: text every database stores, redaction of audit details,
and the lossless JSON-lines form of records (the ``jsonl`` sink and the spill file)."""

from __future__ import annotations

import hashlib
import json
import math
from datetime import UTC, datetime, timedelta, timezone
from enum import Enum
from typing import Any

import pytest
from pydantic import SecretStr

from servehall.config.secrets import MASK
from servehall.records.codec import (
    audit_fields,
    clean_json,
    clean_text,
    dumps,
    from_json,
    iso_utc,
    parse_iso,
    redact,
    request_fields,
    to_json,
)
from servehall.records.types import AuditEvent, RequestRecord

T0 = datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)


@pytest.mark.parametrize(
    ("raw", "clean"),
    [
        ("plain", "plain"),
        ("a\x00b", "ab"),
        ("é\x00", "é"),
        ("x\ud800y", "x\ufffdy"),
        ("\udfff\x00", "\ufffd"),
        ("🙂", "🙂"),
    ],
)
def test_clean_text(raw: str, clean: str) -> None:
    assert clean_text(raw) == clean
    clean_text(raw).encode("utf-8")


def test_clean_json_makes_any_value_storable() -> None:
    class Color(Enum):
        RED = "red"

    value = {
        "k\x00": ("a\x00", 1, True, None),
        5: {"nan": math.nan, "inf": -math.inf, "f": 1.5},
        "when": T0,
        "secret": SecretStr("s"),
        "set": frozenset({"x"}),
        "other": Color.RED,
    }
    assert clean_json(value) == {
        "k": ["a", 1, True, None],
        "5": {"nan": None, "inf": None, "f": 1.5},
        "when": "2026-01-02T03:04:05.678901Z",
        "secret": MASK,
        "set": ["x"],
        "other": "Color.RED",
    }


def test_redact_masks_secret_keys_secret_values_and_url_passwords() -> None:
    details = {
        "password": "hunter2",
        "api_key": "",  # an empty value shows it was empty
        "nested": [{"token": "t"}, SecretStr("s"), "postgresql://u:pw@db/x"],
        "url": "https://example.com/x",
        "count": 3,
    }
    assert redact(details) == {
        "password": MASK,
        "api_key": "",
        "nested": [{"token": MASK}, MASK, f"postgresql://u:{MASK}@db/x"],
        "url": "https://example.com/x",
        "count": 3,
    }


def test_iso_round_trip_naive_aware_and_offsets() -> None:
    assert iso_utc(T0) == "2026-01-02T03:04:05.678901Z"
    assert iso_utc(T0.replace(tzinfo=None)) == iso_utc(T0)
    plus2 = T0.astimezone(timezone(timedelta(hours=2)))
    assert iso_utc(plus2) == iso_utc(T0)
    assert parse_iso(iso_utc(T0)) == T0
    assert parse_iso("2026-01-02T05:04:05.678901+02:00") == T0
    assert parse_iso("2026-01-02T03:04:05.678901").tzinfo is not None


def _request() -> RequestRecord:
    return RequestRecord(
        request_id="r1",
        received_at=T0,
        finished_at=T0 + timedelta(seconds=1),
        principal_id="p\x00",
        model="m",
        endpoint="/v1/chat/completions",
        status_code=200,
        prompt_tokens=3,
        completion_tokens=4,
        ttft_s=0.1,
        stream=True,
        filter_verdicts=[{"name": "f", "verdict": "allow"}],
        prompt_text="hi",
        completion_text="x\ud800",
        tool_calls=["lookup"],
        version="v2",
        batch_id="batch_1",
        custom_id="c",
    )


def test_request_fields_are_cleaned() -> None:
    fields = request_fields(_request())
    assert fields["principal_id"] == "p"
    assert fields["completion_text"] == "x\ufffd"
    assert fields["tool_calls"] == ["lookup"]
    assert request_fields(RequestRecord("r", T0, version=""))["version"] is None


def test_a_request_record_survives_a_json_line() -> None:
    rec = _request()
    line = dumps(rec)
    assert "\n" not in line and ", " not in line
    data = json.loads(line)
    assert data["type"] == "request" and data["received_at"] == "2026-01-02T03:04:05.678901Z"
    back = from_json(data)
    assert isinstance(back, RequestRecord)
    assert back.received_at == rec.received_at and back.finished_at == rec.finished_at
    assert (back.request_id, back.model, back.completion_tokens) == ("r1", "m", 4)
    assert back.principal_id == "p" and back.custom_id == "c"


def test_unknown_request_fields_from_a_newer_writer_are_dropped() -> None:
    data = to_json(RequestRecord("r", T0))
    data["field_of_the_future"] = 1
    back = from_json(data)
    assert isinstance(back, RequestRecord) and back.request_id == "r"


def test_an_audit_event_survives_a_json_line_redacted() -> None:
    ev = AuditEvent(action="key.create", actor="admin", target="k1", details={"secret": "s"}, at=T0)
    assert audit_fields(ev)["details"] == {"secret": MASK}
    back = from_json(json.loads(dumps(ev)))
    assert isinstance(back, AuditEvent)
    assert (back.action, back.actor, back.target, back.at) == ("key.create", "admin", "k1", T0)
    assert back.details == {"secret": MASK} and back.event_id == ev.event_id


def test_an_audit_event_without_a_time_keeps_none() -> None:
    ev = AuditEvent(action="a")
    data = to_json(ev)
    assert data["at"] is None and data["event_id"] == ev.event_id
    back = from_json(data)
    assert isinstance(back, AuditEvent) and back.at is None


def test_an_old_line_without_an_id_gets_one_from_its_content() -> None:
    data: dict[str, Any] = {"type": "audit", "action": "a", "actor": "x", "at": None}
    first, second = from_json(data), from_json(dict(data))
    assert isinstance(first, AuditEvent) and isinstance(second, AuditEvent)
    assert first.event_id == second.event_id
    canon = json.dumps({"action": "a", "actor": "x", "at": None}, sort_keys=True)
    assert first.event_id == hashlib.sha256(canon.encode()).hexdigest()
    other = from_json({**data, "action": "b"})
    assert isinstance(other, AuditEvent) and other.event_id != first.event_id


def test_an_unknown_type_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown record type 'metric'"):
        from_json({"type": "metric"})
