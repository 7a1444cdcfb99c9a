"""The example plugin's sink: retries, gives up cleanly, records every delivery in its
own table; its settings section is validated with one-line errors; its migration matches
its table."""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest

from servehall import AuditEvent, ConfigError, RequestRecord, create_db_engine, load_settings
from servehall.db.migrate import upgrade_database
from servehall.testing.migrations import schema_diff
from servehall_webhook_sink.plugin import servehall_migrations, servehall_settings_models
from servehall_webhook_sink.settings import WebhookSettings
from servehall_webhook_sink.sink import WebhookSink


class _Hook(BaseHTTPRequestHandler):
    script: ClassVar[list[int]] = []
    bodies: ClassVar[list[dict[str, Any]]] = []

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        status = self.script.pop(0) if self.script else 204
        if status < 300:
            self.bodies.append(body)
        self.send_response(status)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def hook_url() -> Iterator[str]:
    _Hook.script, _Hook.bodies = [], []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Hook)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/hook"
    finally:
        server.shutdown()
        server.server_close()


async def _sink(tmp_path: Path, url: str, attempts: int = 3) -> tuple[WebhookSink, Path]:
    db = tmp_path / "w.db"
    engine = create_db_engine(f"sqlite+aiosqlite:///{db}")
    await upgrade_database(engine, servehall_migrations())
    await engine.dispose()
    cfg = WebhookSettings.model_validate({"url": url, "max_attempts": attempts, "backoff_s": 0})
    sink = WebhookSink(cfg, f"sqlite+aiosqlite:///{db}")
    await sink.start()
    return sink, db


def _record(rid: str) -> RequestRecord:
    return RequestRecord(request_id=rid, received_at=datetime.now(UTC), status_code=200)


async def test_retries_then_delivers_and_records(tmp_path: Path, hook_url: str) -> None:
    _Hook.script = [503, 500]
    sink, db = await _sink(tmp_path, hook_url)
    try:
        await sink.write([_record("r1"), AuditEvent(action="key.created")])
    finally:
        await sink.close()
    assert [b["request_id"] for b in _Hook.bodies] == ["r1"]  # audit events are not sent
    assert isinstance(_Hook.bodies[0]["received_at"], str)
    rows = sqlite3.connect(db).execute(
        "SELECT request_id, delivered, attempts, status_code FROM webhook_delivery"
    )
    assert rows.fetchall() == [("r1", 1, 3, 204)]


async def test_gives_up_after_max_attempts_and_says_so(tmp_path: Path, hook_url: str) -> None:
    _Hook.script = [503] * 5
    sink, db = await _sink(tmp_path, hook_url, attempts=2)
    try:
        await sink.write([_record("r2")])
    finally:
        await sink.close()
    row = sqlite3.connect(db).execute(
        "SELECT delivered, attempts, status_code FROM webhook_delivery"
    )
    assert row.fetchall() == [(0, 2, 503)]
    assert _Hook.script == [503] * 3  # exactly two tries


async def test_a_client_error_is_not_retried(tmp_path: Path, hook_url: str) -> None:
    _Hook.script = [404]
    sink, db = await _sink(tmp_path, hook_url)
    try:
        await sink.write([_record("r3")])
    finally:
        await sink.close()
    row = sqlite3.connect(db).execute("SELECT delivered, attempts FROM webhook_delivery")
    assert row.fetchall() == [(0, 1)]


def test_invalid_settings_are_one_line_naming_the_section() -> None:
    models = dict(servehall_settings_models())
    with pytest.raises(ConfigError) as err:
        load_settings(data={"webhook_sink": {"url": "not a url"}}, section_models=models)
    assert "\n" not in str(err.value) and "webhook_sink.url" in str(err.value)


async def test_migration_matches_table(tmp_path: Path) -> None:
    assert (
        await schema_diff(f"sqlite+aiosqlite:///{tmp_path / 'm.db'}", servehall_migrations()) == []
    )


async def test_a_dead_webhook_costs_a_batch_one_records_tries(tmp_path: Path) -> None:
    """A webhook that accepts connections and never answers: 20 records with a 0.5 s
    timeout and 2 tries take about 1 s as one batch (posted concurrently), not 20 s."""
    import asyncio
    import time

    async def hang(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await asyncio.sleep(30)

    server = await asyncio.start_server(hang, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/hook"
    db = tmp_path / "w.db"
    engine = create_db_engine(f"sqlite+aiosqlite:///{db}")
    await upgrade_database(engine, servehall_migrations())
    await engine.dispose()
    cfg = WebhookSettings.model_validate(
        {"url": url, "max_attempts": 2, "backoff_s": 0, "timeout_s": 0.5}
    )
    sink = WebhookSink(cfg, f"sqlite+aiosqlite:///{db}")
    await sink.start()
    try:
        t0 = time.monotonic()
        await sink.write([_record(f"d{i}") for i in range(20)])
        took = time.monotonic() - t0
    finally:
        await sink.close()
        server.close()
    assert took < 6, took  # serial: 20 × 2 × 0.5 s = 20 s
    rows = sqlite3.connect(db).execute("SELECT delivered, attempts FROM webhook_delivery")
    assert sorted(rows) == [(0, 2)] * 20
