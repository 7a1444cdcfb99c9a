"""The tests' config writer (``tests.conftest.dump_toml``, also used by the bench e2e
scripts) writes valid TOML for any text: characters outside the BMP, control characters,
quotes and backslashes round-trip through ``tomllib`` (issue 26)."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from tests.conftest import dump_toml


def test_round_trip_of_awkward_text() -> None:
    text = 'emoji 😀 \U0001f389, CJK 中文, "quotes" \\ back\\slash\ttab\x01\x7f\ud7ff'
    data = {
        "top": text,
        "server": {"host": "127.0.0.1", "port": 8000, "ratio": 0.5, "on": True},
        "models": [{"name": text, "path": Path("/tmp/m 😀"), "options": {"k": [1, 2]}}],
        "sinks": [],
    }
    back = tomllib.loads(dump_toml(data))
    assert back["top"] == text
    assert back["models"][0]["name"] == text and back["models"][0]["path"] == "/tmp/m 😀"
    assert back["models"][0]["options"] == {"k": [1, 2]}
    assert back["server"] == data["server"] and back["sinks"] == []


def test_none_is_refused() -> None:
    with pytest.raises(TypeError):
        dump_toml({"x": None})
