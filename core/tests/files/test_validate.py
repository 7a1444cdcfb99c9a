"""The batch input file check (:mod:`servehall.files.validate`): good files count their
requests; every bad line is a 400 ``invalid_batch_file`` naming its 1-based number."""

from __future__ import annotations

import io
import json
from typing import Any

import pytest

from servehall.errors import InvalidRequestError
from servehall.files.validate import BATCH_URLS, MAX_CUSTOM_ID, check_batch_lines


def line(custom_id: Any = "a", **over: Any) -> bytes:
    obj = {
        "custom_id": custom_id,
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {"model": "demo", "messages": [{"role": "user", "content": "hi"}]},
    }
    obj.update(over)
    obj = {k: v for k, v in obj.items() if v is not _DROP}
    return json.dumps(obj).encode() + b"\n"


_DROP = object()


def refused(data: bytes) -> InvalidRequestError:
    with pytest.raises(InvalidRequestError) as info:
        check_batch_lines(io.BytesIO(data))
    err = info.value
    assert err.status == 400 and err.param == "file" and err.code == "invalid_batch_file"
    return err


def test_good_file_counts_requests() -> None:
    data = line("a") + line("b", url="/v1/completions", body={"prompt": "x"}) + b"\n  \n"
    assert check_batch_lines(io.BytesIO(data)) == 2
    assert set(BATCH_URLS) == {"/v1/chat/completions", "/v1/completions", "/v1/embeddings"}


def test_no_trailing_newline_and_crlf() -> None:
    data = line("a").replace(b"\n", b"\r\n") + line("b").rstrip(b"\n")
    assert check_batch_lines(io.BytesIO(data)) == 2


@pytest.mark.parametrize("data", [b"", b"\n\n", b"   \n"])
def test_empty_file(data: bytes) -> None:
    assert "empty" in refused(data).message


@pytest.mark.parametrize(
    ("bad", "needle"),
    [
        (b"{not json}\n", "not valid JSON"),
        (b'{"custom_id": "x", "body": NaN}\n', "not valid JSON"),
        (b"\xff\xfe\n", "UTF-8"),
        (b"[1, 2]\n", "JSON object"),
        (line(_DROP), "custom_id"),
        (line(""), "custom_id"),
        (line(7), "custom_id"),
        (line("x" * (MAX_CUSTOM_ID + 1)), "longer than"),
        (line("x", method="GET"), "'method' must be \"POST\""),
        (line("x", method=_DROP), "'method'"),
        (line("x", url="/v1/moderations"), "'url' must be one of"),
        (line("x", url=_DROP), "'url'"),
        (line("x", body="text"), "'body' must be a JSON object"),
        (line("x", body=_DROP), "'body'"),
    ],
)
def test_bad_line_is_named(bad: bytes, needle: str) -> None:
    err = refused(line("first") + b"\n" + bad)
    assert err.message.startswith("Line 3: "), err.message
    assert needle in err.message


def test_duplicate_custom_id_names_both_lines() -> None:
    err = refused(line("a") + line("b") + line("a"))
    assert err.message.startswith("Line 3: ")
    assert "line 1" in err.message and "'a'" in err.message


def test_long_values_are_not_echoed_whole() -> None:
    err = refused(line("x", url="/" + "u" * 10_000))
    assert len(err.message) < 300
