"""Bad records (servehall.records.bad_records): which errors are suspect, a failing probe
is an outage, and a bad record goes to the sink's quarantine or else to the quarantine
file (or the log, when even that cannot be written)."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from record_fixtures import request_record as _rec

from servehall.records.bad_records import BadRecords
from servehall.records.types import Record


class _Sink:
    name = "s"

    async def start(self) -> None:
        pass

    async def write(self, records: Sequence[Record]) -> None:
        pass

    async def close(self) -> None:
        pass


class _Judging(_Sink):
    def __init__(self, probe_ok: bool = True, keep_ok: bool = True) -> None:
        self.probe_ok, self.keep_ok = probe_ok, keep_ok
        self.kept: list[tuple[Record, str]] = []

    def suspect(self, exc: Exception) -> bool:
        if isinstance(exc, KeyError):
            raise RuntimeError("cannot judge")
        return isinstance(exc, LookupError)

    async def probe(self) -> None:
        if not self.probe_ok:
            raise ConnectionError("down")

    async def quarantine(self, record: Record, error: str) -> None:
        if not self.keep_ok:
            raise ConnectionError("down")
        self.kept.append((record, error))


def test_suspect_errors(tmp_path: Path) -> None:
    plain = BadRecords(_Sink(), tmp_path / "q.jsonl", 1.0)
    assert plain.suspect(ValueError()) and plain.suspect(TypeError())
    assert not plain.suspect(ConnectionError())
    judged = BadRecords(_Judging(), tmp_path / "q.jsonl", 1.0)
    assert judged.suspect(IndexError()) and not judged.suspect(ValueError())
    assert not judged.suspect(KeyError())  # a judge that raises says no


def test_a_failing_probe_is_an_outage(tmp_path: Path) -> None:
    path = tmp_path / "q.jsonl"
    assert asyncio.run(BadRecords(_Sink(), path, 1.0).takes_good_records())
    up = BadRecords(_Judging(), path, 1.0)
    assert asyncio.run(up.takes_good_records())
    down = BadRecords(_Judging(probe_ok=False), path, 1.0)
    assert not asyncio.run(down.takes_good_records())


def test_the_sinks_quarantine_keeps_a_bad_record(tmp_path: Path) -> None:
    sink = _Judging()
    bad = BadRecords(sink, tmp_path / "q.jsonl", 1.0)
    asyncio.run(bad.reject(_rec(1), ValueError(" bad value ")))
    assert bad.rejected == 1 and not bad.path.exists()
    assert [(r.request_id, e) for r, e in sink.kept] == [("req-1", "ValueError: bad value")]  # type: ignore[union-attr]


def test_else_the_quarantine_file_keeps_it(tmp_path: Path) -> None:
    bad = BadRecords(_Judging(keep_ok=False), tmp_path / "q" / "q.jsonl", 1.0)
    asyncio.run(bad.reject(_rec(2), ValueError("bad")))
    bad.reject_line("not json\n", ValueError("Expecting value"))
    lines = [json.loads(x) for x in bad.path.read_text().splitlines()]
    assert bad.rejected == 2
    assert [(x["kind"], x["request_id"]) for x in lines] == [("request", "req-2"), ("line", None)]
    assert lines[1]["error"].startswith("unreadable spill-file line: ValueError")


def test_an_unwritable_quarantine_file_leaves_the_record_in_the_log(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("a file, not a folder")
    bad = BadRecords(_Sink(), tmp_path / "f" / "q.jsonl", 1.0)
    assert bad._to_file('{"x": 1}') == "the log"
    assert bad.rejected == 0
