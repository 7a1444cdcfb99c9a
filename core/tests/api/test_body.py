"""Body parsing policy: media type, size, JSON shape, NaN, surrogates, depth."""

from __future__ import annotations

import pytest

from servehall.api.body import parse_json_object
from servehall.errors import InvalidRequestError


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"  ",
        b"[]",
        b"null",
        b"1",
        b'"x"',
        b"{",
        b"\xff{}",
        b'{"a": NaN}',
        b'{"a": Infinity}',
        b'{"a": -Infinity}',
        b'{"a": "\\ud83d"}',
        b'{"\\udc00": 1}',
        b'{"a": [' * 100 + b"]}" * 100,
        b'{"a": "x"} trailing',
    ],
)
def test_rejected_bodies(raw: bytes) -> None:
    with pytest.raises(InvalidRequestError) as ei:
        parse_json_object(raw)
    assert ei.value.status == 400
    assert len(ei.value.message) < 300


@pytest.mark.parametrize(
    "raw",
    [
        b'{"a": "\\ud83d\\ude00"}',
        b'{"a": "nul \\u0000 byte"}',
        b'{"a": "[[[[[["}',
        b'{"a": "' + b"[" * 500 + b'"}',
    ],
)
def test_accepted_bodies(raw: bytes) -> None:
    assert isinstance(parse_json_object(raw), dict)


def test_nul_kept() -> None:
    assert parse_json_object(b'{"a": "x\\u0000y"}')["a"] == "x\x00y"
