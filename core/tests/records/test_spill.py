"""One sink's spill file (servehall.records.spill): records appended and read back in
order, the read position saved and resumed (and ignored when it belongs to another
file), a torn last line dropped at adoption, the unreplayed part saved at close."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from record_fixtures import request_record as _rec

from servehall.records.codec import dumps
from servehall.records.spill import SpillFile
from servehall.records.types import Record


def spill(path: Path, max_bytes: int = 1 << 20) -> tuple[SpillFile, list[tuple[str, str]]]:
    warnings: list[tuple[str, str]] = []
    return SpillFile(path, "s", max_bytes, lambda k, m: warnings.append((k, m))), warnings


def ids(records: list[Record]) -> list[str]:
    return [r.request_id for r in records]  # type: ignore[union-attr]


def test_append_read_advance_end(tmp_path: Path) -> None:
    f, warnings = spill(tmp_path / "sp.jsonl")
    assert not f.active and f.unread_bytes == 0 and f.has_room
    assert all(f.append(_rec(i)) for i in range(5))
    assert f.active and [k for k, _ in warnings] == ["spill"]
    assert f.unread_bytes == (tmp_path / "sp.jsonl").stat().st_size
    records, ends, pos = f.read(3, lambda line, exc: None)
    assert ids(records) == ["req-0", "req-1", "req-2"] and ends[-1] == pos
    f.advance(pos)
    assert json.loads(f.pos_path.read_text())["pos"] == pos
    records, ends, pos = f.read(10, lambda line, exc: None)
    assert ids(records) == ["req-3", "req-4"]
    f.advance(pos)
    assert f.unread_bytes == 0
    f.end()
    assert not f.active and not f.path.exists() and not f.pos_path.exists()


def test_an_unreadable_line_is_handed_over_and_skipped(tmp_path: Path) -> None:
    path = tmp_path / "sp.jsonl"
    path.write_text(dumps(_rec(1)) + "\nnot json\n" + dumps(_rec(2)) + "\n")
    f, _ = spill(path)
    f.adopt()
    bad: list[str] = []
    records, ends, pos = f.read(10, lambda line, exc: bad.append(line))
    assert ids(records) == ["req-1", "req-2"] and bad == ["not json\n"]
    assert len(ends) == 2 and pos == path.stat().st_size


def test_the_size_limit(tmp_path: Path) -> None:
    f, _ = spill(tmp_path / "sp.jsonl", max_bytes=10)
    assert f.append(_rec(1))
    assert not f.has_room


def test_a_write_error_breaks_the_file(tmp_path: Path) -> None:
    (tmp_path / "dir").write_text("a file, not a folder")
    f, warnings = spill(tmp_path / "dir" / "sp.jsonl")
    assert not f.append(_rec(1))
    assert f.broken and not f.has_room and not f.active
    assert [k for k, _ in warnings] == ["spill-error"]


def test_adopt_drops_a_torn_line_and_resumes_at_the_saved_position(tmp_path: Path) -> None:
    path = tmp_path / "sp.jsonl"
    first = dumps(_rec(1)) + "\n"
    path.write_text(first + dumps(_rec(2)) + "\n" + '{"torn')
    f, _ = spill(path)
    f.adopt()
    assert f.active and not path.read_text().endswith('{"torn')
    f.advance(len(first))
    again, _ = spill(path)
    again.adopt()
    assert again.read_pos == len(first)
    assert ids(again.read(10, lambda line, exc: None)[0]) == ["req-2"]


def test_the_pos_file_of_another_file_is_ignored(tmp_path: Path) -> None:
    path = tmp_path / "sp.jsonl"
    path.write_text(dumps(_rec(1)) + "\n")
    (tmp_path / "sp.jsonl.pos").write_text(json.dumps({"ino": -1, "pos": 3}))
    f, _ = spill(path)
    f.adopt()
    assert f.read_pos == 0


def test_an_empty_file_is_removed_at_adoption(tmp_path: Path) -> None:
    path = tmp_path / "sp.jsonl"
    path.write_text("")
    f, _ = spill(path)
    f.adopt()
    assert not path.exists() and not f.active


def test_save_keeps_memory_unread_spill_and_tail_in_order(tmp_path: Path) -> None:
    f, _ = spill(tmp_path / "sp.jsonl")
    for i in (1, 2, 3):
        f.append(_rec(i))
    _, ends, _ = f.read(1, lambda line, exc: None)
    f.advance(ends[0])  # req-1 replayed
    assert f.save([_rec(0)], [_rec(9)], 2)
    lines = f.path.read_text().splitlines()
    assert [json.loads(x)["request_id"] for x in lines] == ["req-0", "req-2", "req-3", "req-9"]
    assert not f.pos_path.exists()


def test_save_with_nothing_left_removes_the_file(tmp_path: Path) -> None:
    f, _ = spill(tmp_path / "sp.jsonl")
    f.append(_rec(1))
    f.advance(f.bytes)
    assert not f.save([], [], 0)
    assert not f.path.exists() and not f.pos_path.exists()
