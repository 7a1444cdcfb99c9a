"""``servehall.records.types``: record defaults and the sink options check."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from servehall.errors import ConfigError
from servehall.records.types import AuditEvent, RequestRecord, Sink, check_sink_options


def test_audit_event_ids_are_fresh_uuid4_hex() -> None:
    a, b = AuditEvent("key.created"), AuditEvent("key.created")
    assert a.event_id != b.event_id
    assert len(a.event_id) == 32 and int(a.event_id, 16) >= 0
    assert (a.actor, a.target, a.details, a.at) == ("system", None, {}, None)
    a.details["x"] = 1
    assert b.details == {}  # no shared default


def test_request_record_defaults() -> None:
    r = RequestRecord("req-1", datetime(2026, 1, 1, tzinfo=UTC))
    assert r.status_code == 0 and r.endpoint == "" and r.filter_verdicts == []
    assert r.tool_calls is None and r.store_prompts is None and r.batch_id is None


def test_check_sink_options() -> None:
    check_sink_options("jsonl", {"path": "x"}, ("path", "rotate_mb"))
    check_sink_options("jsonl", {}, ())
    with pytest.raises(ConfigError) as info:
        check_sink_options("jsonl", {"zeta": 1, "alpha": 2, "path": "x"}, ("path", "rotate_mb"))
    assert str(info.value).startswith("jsonl sink: unknown option(s) alpha, zeta; known: path")
    assert "rotate_mb" in str(info.value)


def test_sink_protocol_is_checked_at_runtime() -> None:
    class Good:
        name = "g"
        required = False

        async def start(self) -> None: ...

        async def write(self, records: object) -> None: ...

        async def close(self) -> None: ...

    class NoClose:
        name = "n"
        required = False

        async def start(self) -> None: ...

        async def write(self, records: object) -> None: ...

    assert isinstance(Good(), Sink)
    assert not isinstance(NoClose(), Sink)
