"""Records that cannot be wedged (issue 33, item 1), on a real SQLite file and a real
PostgreSQL database: a row the database refuses is quarantined alone in
``record_rejected`` (or the quarantine file when that fails too) and every other row of
its batch is written; a required sink stays ready; an outage is retried, never
quarantined; a spill file holding a bad row replays without stalling; a replay cut off by
a crash resumes where it was (nothing written twice)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from record_fixtures import request_record as _rec

from servehall import AuditEvent
from servehall.db import create_db_engine
from servehall.db.testing import (
    REJECT_MESSAGE,
    accept_rows,
    reject_rows,
    run_sql,
)
from servehall.records.chain import append_events, verify_chain
from servehall.records.codec import dumps, from_json
from servehall.records.quarantine import count_rejected
from servehall.records.runner import SinkRunner
from servehall.records.sql_sink import SqlSink


@pytest.fixture
def url(migrated: str) -> str:
    """A migrated database: a SQLite file, or a fresh PostgreSQL database (conftest)."""
    return migrated


def runner(url: str, tmp_path: Path, **kw: Any) -> SinkRunner:
    options: dict[str, Any] = {
        "spill_path": tmp_path / "spill.jsonl",
        "retry_initial_s": 0.02,
        "retry_max_s": 0.1,
        "linger_s": 0.0,
        "check_interval_s": 0,
    }
    options.update(kw)
    return SinkRunner(SqlSink(url), **options)


async def wait_for(cond: Callable[[], bool], timeout: float = 15.0) -> None:
    end = asyncio.get_running_loop().time() + timeout
    while not cond():
        if asyncio.get_running_loop().time() > end:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.02)


async def request_ids(url: str) -> list[str]:
    rows = await run_sql(url, "SELECT request_id FROM request_log ORDER BY received_at")
    return [r.request_id for r in rows]


async def rejected(url: str) -> list[Any]:
    return await run_sql(
        url, "SELECT sink, kind, request_id, payload, error FROM record_rejected ORDER BY id"
    )


async def test_a_bad_row_is_quarantined_alone_and_the_sink_stays_ready(
    url: str, tmp_path: Path
) -> None:
    await reject_rows(url, "NEW.request_id = 'req-5'")
    r = runner(url, tmp_path, required=True, fail_closed="at_once")
    await r.start()
    try:
        for i in range(10):
            r.put(_rec(i, tool_calls=[] if i == 5 else None))
        await wait_for(lambda: r.written + r.rejected >= 10)
        assert r.healthy and not r.refusing  # one bad row never fails a sink closed
        assert r.failures == 0
    finally:
        await r.close()
    assert await request_ids(url) == [f"req-{i}" for i in range(10) if i != 5]
    (row,) = await rejected(url)
    assert (row.sink, row.kind, row.request_id) == ("sql", "request", "req-5")
    assert REJECT_MESSAGE in row.error
    kept = from_json(json.loads(row.payload))  # the record itself, as the spill file has it
    assert kept.request_id == "req-5" and kept.tool_calls == []  # type: ignore[union-attr]
    assert r.stats()["rejected"] == 1 and r.stats()["written"] == 9
    assert not (tmp_path / "spill.jsonl").exists()
    engine = create_db_engine(url)
    try:
        assert await count_rejected(engine) == {"sql": 1}
    finally:
        await engine.dispose()


async def test_a_bad_row_next_to_audit_events_keeps_the_chain(url: str, tmp_path: Path) -> None:
    await reject_rows(url, "NEW.request_id = 'req-1'")
    r = runner(url, tmp_path)
    await r.start()
    try:
        r.put(AuditEvent(action="a.one"))
        r.put(_rec(1))
        r.put(AuditEvent(action="a.two"))
        r.put(_rec(2))
        await wait_for(lambda: r.written + r.rejected >= 4)
    finally:
        await r.close()
    assert await request_ids(url) == ["req-2"]
    actions = [x.action for x in await run_sql(url, "SELECT action FROM audit_event ORDER BY id")]
    assert actions == ["a.one", "a.two"]
    engine = create_db_engine(url)
    try:
        assert (await verify_chain(engine)).ok
    finally:
        await engine.dispose()
    assert [x.request_id for x in await rejected(url)] == ["req-1"]


async def test_without_the_table_the_quarantine_file_keeps_the_record(
    url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    await reject_rows(url, "NEW.request_id = 'req-3'")
    await run_sql(url, "DROP TABLE record_rejected")
    r = runner(url, tmp_path)
    await r.start()
    try:
        for i in range(5):
            r.put(_rec(i))
        await wait_for(lambda: r.written + r.rejected >= 5)
    finally:
        await r.close()
    assert await request_ids(url) == ["req-0", "req-1", "req-2", "req-4"]
    path = tmp_path / "servehall-rejected-sql.jsonl"
    assert r.quarantine_path == path
    (line,) = path.read_text().splitlines()
    kept = json.loads(line)
    assert kept["request_id"] == "req-3" and kept["kind"] == "request"
    assert REJECT_MESSAGE in kept["error"]
    assert from_json(json.loads(kept["payload"])).request_id == "req-3"  # type: ignore[union-attr]
    logged = "\n".join(m.getMessage() for m in caplog.records)
    assert "req-3" in logged and str(path) in logged


async def test_an_outage_is_retried_never_quarantined(url: str, tmp_path: Path) -> None:
    """A missing table (a programming error on PostgreSQL, like a bad value) fails the
    probe of a known-good row: an outage, so nothing is quarantined and all is written
    once the table is back."""
    await run_sql(url, "ALTER TABLE request_log RENAME TO request_log_away")
    r = runner(url, tmp_path, required=True, fail_closed="at_once")
    await r.start()
    try:
        for i in range(4):
            r.put(_rec(i))
        await wait_for(lambda: r.failures >= 2)
        assert not r.healthy and r.refusing and r.rejected == 0
        await run_sql(url, "ALTER TABLE request_log_away RENAME TO request_log")
        await wait_for(lambda: r.written >= 4)
        assert r.healthy and r.rejected == 0
    finally:
        await r.close()
    assert await request_ids(url) == [f"req-{i}" for i in range(4)]
    assert await rejected(url) == []


async def test_a_spill_file_with_a_bad_row_replays_without_stalling(
    url: str, tmp_path: Path
) -> None:
    spill = tmp_path / "spill.jsonl"
    lines = [dumps(_rec(i, tool_calls=[] if i % 2 else None)) for i in range(6)]
    lines.insert(3, "{not json")  # a torn or corrupt line
    spill.write_text("\n".join(lines) + "\n")
    await reject_rows(url, "NEW.request_id = 'req-4'")
    r = runner(url, tmp_path, batch_size=4)
    await r.start()
    try:
        await wait_for(lambda: not spill.exists())
        assert r.healthy
    finally:
        await r.close()
    assert await request_ids(url) == ["req-0", "req-1", "req-2", "req-3", "req-5"]
    assert [x.request_id for x in await rejected(url)] == ["req-4"]
    (line,) = (tmp_path / "servehall-rejected-sql.jsonl").read_text().splitlines()
    assert json.loads(line)["kind"] == "line" and "{not json" in json.loads(line)["payload"]
    assert r.rejected == 2
    # a restart finds nothing to replay and quarantines nothing again
    again = runner(url, tmp_path)
    await again.start()
    await again.close()
    assert again.rejected == 0 and again.written == 0
    assert len(await rejected(url)) == 1 and len(await request_ids(url)) == 5


class _Stuck(SqlSink):
    """A SqlSink whose writes hang after ``allow`` batches (the process is then killed)."""

    allow = 2

    async def write(self, records: Any) -> None:
        if self.allow <= 0:
            await asyncio.Event().wait()
        self.allow -= 1
        await super().write(records)


async def test_a_replay_cut_off_by_a_crash_resumes_where_it_was(url: str, tmp_path: Path) -> None:
    """Audit events are not idempotent: replaying a spill file twice would append them
    twice. The replay position is saved after each batch, so a restart after a crash
    goes on from there."""
    spill = tmp_path / "spill.jsonl"
    events = [AuditEvent(action=f"e.{i}") for i in range(6)]
    for ev in events:
        ev.at = _rec(0).received_at
    spill.write_text("".join(dumps(ev) + "\n" for ev in events))
    stuck = SinkRunner(_Stuck(url), spill_path=spill, batch_size=2, linger_s=0, check_interval_s=0)
    await stuck.start()
    await wait_for(lambda: stuck.written >= 4)
    # the crash: the task dies, nothing is saved (no close())
    assert stuck._task is not None
    stuck._task.cancel()
    with contextlib.suppress(BaseException):
        await stuck._task
    with contextlib.suppress(Exception):
        await stuck.sink.close()
    assert spill.exists() and Path(str(spill) + ".pos").exists()
    r = runner(url, tmp_path)
    await r.start()
    try:
        await wait_for(lambda: not spill.exists())
    finally:
        await r.close()
    actions = [x.action for x in await run_sql(url, "SELECT action FROM audit_event ORDER BY id")]
    assert actions == [f"e.{i}" for i in range(6)]  # each once, in order
    assert not Path(str(spill) + ".pos").exists()


async def test_the_pos_file_of_another_spill_file_is_ignored(url: str, tmp_path: Path) -> None:
    spill = tmp_path / "spill.jsonl"
    spill.write_text("".join(dumps(_rec(i)) + "\n" for i in range(3)))
    Path(str(spill) + ".pos").write_text(json.dumps({"ino": os.stat(spill).st_ino + 1, "pos": 5}))
    r = runner(url, tmp_path)
    await r.start()
    try:
        await wait_for(lambda: not spill.exists())
    finally:
        await r.close()
    assert await request_ids(url) == ["req-0", "req-1", "req-2"]
    await accept_rows(url)  # no trigger: still fine


async def test_a_batch_replayed_after_its_commit_is_chained_once(url: str, tmp_path: Path) -> None:
    """The crash between a replayed batch's commit and its ``<spill>.pos`` update: the
    same lines are replayed again. Each audit event has its own id (kept in the spill
    file; derived from the line for a line written before ids existed), the append skips
    an id already stored, and the chain stays valid."""
    spill = tmp_path / "spill.jsonl"
    events = [AuditEvent(action=f"e.{i}", at=_rec(0).received_at) for i in range(3)]
    legacy = json.loads(dumps(AuditEvent("e.old", at=events[0].at)))
    del legacy["event_id"]
    lines = "".join(dumps(ev) + "\n" for ev in events) + json.dumps(legacy) + "\n"
    for replay in range(2):  # the second replay: the same file, no position saved
        spill.write_text(lines + dumps(AuditEvent(f"new.{replay}", at=events[0].at)) + "\n")
        r = runner(url, tmp_path)
        await r.start()
        try:
            await wait_for(lambda: not spill.exists())
        finally:
            await r.close()
    rows = await run_sql(url, "SELECT action, event_id FROM audit_event ORDER BY id")
    assert [x.action for x in rows] == ["e.0", "e.1", "e.2", "e.old", "new.0", "new.1"]
    assert [x.event_id for x in rows[:3]] == [ev.event_id for ev in events]
    engine = create_db_engine(url)
    try:
        res = await verify_chain(engine)
        assert res.ok and res.checked == 6, res
        # the same event twice in one batch, then the whole batch again: one copy
        again = [AuditEvent("twice", at=events[0].at)] * 2
        async with engine.begin() as conn:
            assert await append_events(conn, again) == 1
        async with engine.begin() as conn:
            assert await append_events(conn, again + events) == 0
        res = await verify_chain(engine)
    finally:
        await engine.dispose()
    assert res.ok and res.checked == 7, res
