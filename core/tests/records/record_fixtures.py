"""A request-log record for the record tests (shared by the ``sql`` sink's tests)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from servehall import RequestRecord


def request_record(i: int, **kw: Any) -> RequestRecord:
    """Record ``req-i``, received ``i`` s after 2026-11-29 12:00 UTC; ``kw`` overrides fields."""
    base = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
    fields: dict[str, Any] = {
        "request_id": f"req-{i}",
        "received_at": base + timedelta(seconds=i),
        "finished_at": base + timedelta(seconds=i, milliseconds=250),
        "principal_id": "key-ab12",
        "tenant": "acme",
        "model": "demo",
        "backend": "openvino_cpu",
        "endpoint": "/v1/chat/completions",
        "status_code": 200,
        "finish_reason": "stop",
        "prompt_tokens": 10,
        "completion_tokens": 5,
        "queue_time_s": 0.001,
        "ttft_s": 0.05,
        "latency_s": 0.25,
        "client_addr": "127.0.0.1",
    }
    fields.update(kw)
    return RequestRecord(**fields)
