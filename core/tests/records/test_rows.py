"""One serialisation of a request record for every write path (issue 33, item 1):
:func:`servehall.records.rows.request_row` over every field type and value the API
produces — tools with a text answer (``tool_calls = []``), tool calls, response formats,
versions, filter verdicts, Unicode, NUL, lone surrogates, enums, out-of-range numbers —
written into a real SQLite file through the fast path and through SQLAlchemy, and into a
real PostgreSQL database, and read back equal."""

from __future__ import annotations

import asyncio
import enum
import json
import math
import sys
from collections.abc import AsyncIterator, Sequence
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import Table, select

sys.path.insert(0, str(Path(__file__).parent))
from record_fixtures import request_record as _rec

from servehall import AuditEvent, RequestRecord
from servehall.db import create_db_engine
from servehall.db.migrate import upgrade_database
from servehall.db.models import RequestLog
from servehall.db.testing import create_pg_database, drop_pg_database, require_pg
from servehall.records.codec import clean_text, dumps, from_json
from servehall.records.rows import INT_MAX, INT_MIN, REQUEST_COLUMNS, request_row
from servehall.records.sql_sink import SqlSink

_T: Table = RequestLog.__table__  # type: ignore[assignment]


class Finish(enum.StrEnum):
    STOP = "stop"


class Plain(enum.Enum):
    JSON = "json_schema"


VERDICT = {"rule": "pii", "action": "redact", "stage": "output", "count": 2, "monitor": False}

# Every value the API path puts in a record (serving/request.py), and worse.
API_RECORDS: list[RequestRecord] = [
    _rec(0),
    _rec(1, tool_calls=[]),  # `tools` offered, text answer (the issue-33 row)
    _rec(2, tool_calls=["get_weather", "get_time"], finish_reason="tool_calls"),
    _rec(3, response_format="json_object"),
    _rec(4, response_format="json_schema", version="v2"),
    _rec(5, response_format="regex", version=""),
    _rec(6, response_format="choice", filter_verdicts=[VERDICT, {**VERDICT, "rule": "ünï"}]),
    _rec(7, stream=True, finish_reason="client_disconnect", status_code=499, ttft_s=None),
    _rec(8, status_code=400, error_code="invalid_request_error", finish_reason=None),
    _rec(9, prompt_text="a\x00b 漢字 🙂", completion_text="\ud800lone", store_prompts=True),
    _rec(10, tool_calls=["na\x00me", "\udfffx"], model="dé\x00mo", tenant="t\ud83d"),
    _rec(11, finish_reason=Finish.STOP, response_format=Plain.JSON),  # type: ignore[arg-type]
    _rec(12, prompt_tokens=2**40, completion_tokens=-(2**40), latency_s=math.nan),
    _rec(13, queue_time_s=math.inf, ttft_s=-math.inf, finished_at=None),
    _rec(14, model="m" * 1000, version="v" * 200, client_addr="c" * 300, replica="r" * 500),
    _rec(15, filter_verdicts=[{"rule": "x", "nested": {"k\x00": [1.5, None, math.nan]}}]),
    _rec(16, received_at=datetime(2026, 11, 29, 12, 0), endpoint="/v1/completions"),
    _rec(17, received_at=datetime(2026, 11, 29, 13, 0, tzinfo=timezone(timedelta(hours=2)))),
]


def _decoded(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str) else value


def expected(rec: RequestRecord) -> dict[str, Any]:
    """What reading ``rec``'s row back gives (JSON columns decoded)."""
    row = request_row(rec)
    for key in ("filter_verdicts", "tool_calls"):
        if row[key] is not None:
            row[key] = json.loads(str(row[key]))
    return row


async def read_back(url: str) -> dict[str, dict[str, Any]]:
    engine = create_db_engine(url)
    try:
        async with engine.connect() as conn:
            rows = (await conn.execute(select(_T))).mappings().all()
    finally:
        await engine.dispose()
    out = {}
    for r in rows:
        row = dict(r)
        for key in ("filter_verdicts", "tool_calls"):
            row[key] = _decoded(row[key])
        out[row["request_id"]] = row
    return out


def assert_same(got: dict[str, Any], want: dict[str, Any]) -> None:
    for col in REQUEST_COLUMNS:
        g, w = got[col], want[col]
        if isinstance(w, float) and isinstance(g, float):
            assert g == pytest.approx(w, rel=1e-12), col
        elif col == "stream":
            assert bool(g) == w, col
        else:
            assert g == w, (col, g, w)


@pytest.fixture(params=["sqlite", "sqlite-sqlalchemy", "postgresql"])
async def url_and_path(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[str]:
    """A migrated database; the ``sqlite-sqlalchemy`` case writes through SQLAlchemy."""
    if request.param.startswith("sqlite"):
        url = f"sqlite+aiosqlite:///{tmp_path / 'records.db'}"
    else:
        url = await create_pg_database(require_pg())
    engine = create_db_engine(url)
    await upgrade_database(engine)
    await engine.dispose()
    request.node.path_kind = request.param
    try:
        yield url
    finally:
        if request.param == "postgresql":
            await drop_pg_database(url)


async def write(url: str, records: Sequence[RequestRecord], *, sqlalchemy: bool) -> None:
    sink = SqlSink(url)
    await sink.start()
    try:
        if sqlalchemy:
            sink._rows = None  # the SQLite file's fast path off: SQLAlchemy + aiosqlite
        await sink.write(list(records))
    finally:
        await sink.close()


async def test_every_api_value_is_written_and_read_back_on_every_path(
    url_and_path: str, request: pytest.FixtureRequest
) -> None:
    kind = request.node.path_kind
    sink = SqlSink(url_and_path)
    await sink.start()
    try:
        if kind == "sqlite-sqlalchemy":
            sink._rows = None
        if kind == "sqlite":
            assert sink._rows is not None
        for rec in API_RECORDS:  # one at a time: each must be accepted on its own
            await sink.write([rec])
        # and all again in one batch with an audit event (one transaction, no duplicate)
        await sink.write([*API_RECORDS, AuditEvent(action="x", details={"k": "\x00v"})])
    finally:
        await sink.close()
    got = await read_back(url_and_path)
    assert len(got) == len(API_RECORDS)
    for rec in API_RECORDS:
        want = expected(rec)
        assert_same(got[str(want["request_id"])], want)
    one = got["req-1"]
    assert one["tool_calls"] == []  # tools offered, no call: [] (not NULL, not an error)
    assert got["req-0"]["tool_calls"] is None  # no tools offered
    assert got["req-2"]["tool_calls"] == ["get_weather", "get_time"]
    assert got["req-10"]["tool_calls"] == ["name", "\ufffdx"]
    assert got["req-11"]["finish_reason"] == "stop"
    assert got["req-11"]["response_format"] == "json_schema"
    assert got["req-12"]["prompt_tokens"] == INT_MAX and got["req-12"]["latency_s"] is None
    assert got["req-12"]["completion_tokens"] == INT_MIN
    assert len(got["req-14"]["model"]) == 256 and len(got["req-14"]["version"]) == 64
    assert got["req-5"]["version"] is None  # an unversioned model: NULL
    assert got["req-17"]["received_at"] == datetime(2026, 11, 29, 11, 0, tzinfo=UTC)


def test_the_row_is_plain_values_and_the_spill_form_round_trips() -> None:
    for rec in API_RECORDS:
        row = request_row(rec)
        assert tuple(row) == REQUEST_COLUMNS
        for col, value in row.items():
            assert value is None or type(value) in (str, int, float, bool, datetime), col
            if isinstance(value, str):
                assert "\x00" not in value and clean_text(value) == value
        again = from_json(json.loads(dumps(rec)))
        assert isinstance(again, RequestRecord)
        # the spill file's form writes the same row (replay == first write)
        assert request_row(again) == row, rec.request_id


# --- any value a field can hold (hypothesis) ------------------------------------------

ANY_TEXT = st.text(st.characters(exclude_categories=()), max_size=40)
NAMES = st.one_of(ANY_TEXT, st.sampled_from(["get_weather", "lookup", "a" * 300]))
NUMBERS = st.one_of(st.integers(), st.floats(allow_nan=True, allow_infinity=True))
JSONISH = st.recursive(
    st.one_of(st.none(), st.booleans(), NUMBERS, ANY_TEXT),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(ANY_TEXT, inner, max_size=3)
    ),
    max_leaves=8,
)
OPT_TEXT = st.one_of(st.none(), ANY_TEXT, st.sampled_from(list(Finish)))
TIMES = st.datetimes(
    min_value=datetime(1971, 1, 1), max_value=datetime(2200, 1, 1), timezones=st.just(UTC)
)


@st.composite
def records(draw: st.DrawFn, i: int = 0) -> RequestRecord:
    return RequestRecord(
        request_id=draw(ANY_TEXT.map(lambda s: "h-" + s[:100])),
        received_at=draw(TIMES),
        finished_at=draw(st.one_of(st.none(), TIMES)),
        principal_id=draw(OPT_TEXT),
        tenant=draw(OPT_TEXT),
        model=draw(OPT_TEXT),
        backend=draw(OPT_TEXT),
        endpoint=draw(ANY_TEXT),
        status_code=draw(st.integers(0, 2**63)),
        error_code=draw(OPT_TEXT),
        finish_reason=draw(OPT_TEXT),
        prompt_tokens=draw(st.integers(-(2**64), 2**64)),
        completion_tokens=draw(st.integers(-(2**64), 2**64)),
        queue_time_s=draw(st.one_of(st.none(), NUMBERS)),
        ttft_s=draw(st.one_of(st.none(), NUMBERS)),
        latency_s=draw(st.one_of(st.none(), NUMBERS)),
        stream=draw(st.booleans()),
        client_addr=draw(OPT_TEXT),
        filter_verdicts=draw(st.lists(st.dictionaries(ANY_TEXT, JSONISH, max_size=4), max_size=3)),
        prompt_text=draw(OPT_TEXT),
        completion_text=draw(OPT_TEXT),
        replica=draw(OPT_TEXT),
        response_format=draw(
            st.one_of(OPT_TEXT, st.sampled_from(["json_object", "json_schema", "regex", "choice"]))
        ),
        tool_calls=draw(st.one_of(st.none(), st.lists(NAMES, max_size=4))),
        version=draw(OPT_TEXT),
    )


def _unique(batch: list[RequestRecord]) -> list[RequestRecord]:
    seen: dict[str, RequestRecord] = {}
    for rec in batch:
        seen.setdefault(str(request_row(rec)["request_id"]), rec)
    return list(seen.values())


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_any_record_is_accepted_by_the_database(backend: str, tmp_path: Path) -> None:
    """Whatever a record holds, its row is accepted and reads back as request_row says."""
    base = require_pg() if backend == "postgresql" else ""
    counter = iter(range(10_000))

    async def one(batch: list[RequestRecord], sqlalchemy: bool) -> None:
        if backend == "postgresql":
            url = await create_pg_database(base)
        else:
            url = f"sqlite+aiosqlite:///{tmp_path / f'h{next(counter)}.db'}"
        try:
            engine = create_db_engine(url)
            await upgrade_database(engine)
            await engine.dispose()
            await write(url, batch, sqlalchemy=sqlalchemy)
            got = await read_back(url)
            assert len(got) == len(batch)
            for rec in batch:
                want = expected(rec)
                assert_same(got[str(want["request_id"])], want)
        finally:
            if backend == "postgresql":
                await drop_pg_database(url)

    @settings(
        max_examples=15,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(st.lists(records(), min_size=1, max_size=8).map(_unique), st.booleans())
    def check(batch: list[RequestRecord], sqlalchemy: bool) -> None:
        asyncio.run(one(batch, sqlalchemy))

    check()
