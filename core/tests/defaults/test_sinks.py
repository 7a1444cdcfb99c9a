"""Tests of servehall.defaults.sinks: the ``sql`` and ``jsonl`` sinks are registered, built
lazily from their options, and refuse unknown options."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import servehall
from servehall import ConfigError, Settings
from servehall.defaults.sinks import servehall_register_sinks
from servehall.plugin.registries import SinkRegistry


@pytest.fixture
def registry() -> SinkRegistry:
    reg = SinkRegistry()
    servehall_register_sinks(reg)
    return reg


def test_sql_and_jsonl_are_registered(registry: SinkRegistry) -> None:
    assert registry.names() == ["jsonl", "sql"]
    assert all(registry.get(n).description for n in registry.names())


def test_jsonl_sink_builds_from_its_path(registry: SinkRegistry, tmp_path: Path) -> None:
    from servehall.records.jsonl_sink import JsonlSink

    sink = registry.get("jsonl").factory({"path": str(tmp_path / "r.jsonl")}, Settings())
    assert isinstance(sink, JsonlSink)


def test_sql_sink_builds_for_the_database_url(registry: SinkRegistry, tmp_path: Path) -> None:
    from servehall.records.sql_sink import SqlSink

    url = f"sqlite+aiosqlite:///{tmp_path / 'r.db'}"
    sink = registry.get("sql").factory({}, Settings(database={"url": url}))
    assert isinstance(sink, SqlSink)


@pytest.mark.parametrize(("kind", "known"), [("jsonl", "path"), ("sql", "url")])
def test_unknown_options_are_refused(registry: SinkRegistry, kind: str, known: str) -> None:
    with pytest.raises(
        ConfigError, match=f"{kind} sink: unknown option\\(s\\) pth; known: {known}"
    ):
        registry.get(kind).factory({"pth": "x"}, Settings())


def test_registering_imports_no_sink_module() -> None:
    code = (
        "import sys\n"
        "from servehall.defaults.sinks import servehall_register_sinks\n"
        "from servehall.plugin.registries import SinkRegistry\n"
        "servehall_register_sinks(SinkRegistry())\n"
        "print(sorted(m for m in ('servehall.records.sql_sink', 'servehall.records.jsonl_sink',"
        " 'alembic') if m in sys.modules))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PYTHONPATH": str(Path(servehall.__file__).parent.parent), "PATH": "/usr/bin:/bin"},
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
