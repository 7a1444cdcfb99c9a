"""``servehall.records.jsonl_sink``: records appended as JSON lines to a real file (or
stdout), read back with the codec."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from servehall.config.settings import Settings
from servehall.errors import ConfigError
from servehall.records.codec import from_json
from servehall.records.jsonl_sink import JsonlSink, jsonl_sink_factory
from servehall.records.types import AuditEvent, RequestRecord

T0 = datetime(2026, 1, 1, tzinfo=UTC)


async def test_records_are_appended_as_lines_across_restarts(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "dir" / "records.jsonl"
    sink = JsonlSink(path)
    assert not sink.required and sink.name == "jsonl"
    await sink.start()
    await sink.write([RequestRecord("r1", T0, model="m"), AuditEvent("a", at=T0)])
    await sink.close()
    await sink.close()  # idempotent
    again = JsonlSink(str(path))
    await again.start()
    await again.write([RequestRecord("r2", T0)])
    await again.close()
    lines = path.read_text().splitlines()
    assert [json.loads(x)["type"] for x in lines] == ["request", "audit", "request"]
    back = [from_json(json.loads(x)) for x in lines]
    assert isinstance(back[0], RequestRecord) and back[0].model == "m"
    assert isinstance(back[2], RequestRecord) and back[2].request_id == "r2"


@pytest.mark.parametrize("path", [None, "-", "stdout"])
async def test_stdout_is_written_and_left_open(
    path: str | None, capsys: pytest.CaptureFixture[str]
) -> None:
    sink = JsonlSink(path)
    assert sink.path is None
    await sink.start()
    await sink.write([RequestRecord("r1", T0)])
    await sink.close()
    out = capsys.readouterr().out
    assert json.loads(out)["request_id"] == "r1"
    print("still open")
    assert capsys.readouterr().out == "still open\n"


def test_factory_takes_path_and_refuses_other_options(tmp_path: Path) -> None:
    settings: Any = Settings()
    sink = jsonl_sink_factory({"path": str(tmp_path / "x.jsonl")}, settings)
    assert sink.path == tmp_path / "x.jsonl"
    assert jsonl_sink_factory({}, settings).path is None
    with pytest.raises(ConfigError):
        jsonl_sink_factory({"file": "x"}, settings)
