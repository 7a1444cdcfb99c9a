"""``servehall.config.worker.WorkerSettings``: bounds of each supervision time and the
cross-field rules (timeouts above the heartbeat interval, backoff max above its start)."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from servehall.config.worker import WorkerSettings


def test_defaults_are_consistent() -> None:
    w = WorkerSettings()
    assert w.heartbeat_timeout_s > w.heartbeat_interval_s
    assert w.loop_timeout_s > w.heartbeat_interval_s
    assert w.restart_backoff_max_s >= w.restart_backoff_s
    assert w.python is None and w.switch_interval_s is None


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (
            {"heartbeat_interval_s": 1, "heartbeat_timeout_s": 1},
            "heartbeat_timeout_s must be larger than heartbeat_interval_s",
        ),
        (
            {"heartbeat_interval_s": 2, "heartbeat_timeout_s": 5, "loop_timeout_s": 2},
            "loop_timeout_s must be larger than heartbeat_interval_s",
        ),
        (
            {"restart_backoff_s": 10, "restart_backoff_max_s": 5},
            "restart_backoff_max_s must be >= restart_backoff_s",
        ),
    ],
)
def test_cross_field_rules(fields: dict[str, float], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        WorkerSettings(**fields)  # type: ignore[arg-type]


def test_equal_backoffs_are_allowed() -> None:
    assert WorkerSettings(restart_backoff_s=5, restart_backoff_max_s=5).restart_backoff_s == 5


@pytest.mark.parametrize(
    "fields",
    [
        {"heartbeat_interval_s": 0},
        {"heartbeat_interval_s": 11},
        {"switch_interval_s": 0},
        {"switch_interval_s": 2},
        {"stream_interval_s": -0.1},
        {"stream_interval_s": 1.5},
        {"crash_loop_restarts": -1},
        {"stop_timeout_s": -1},
        {"unknown": 1},
    ],
)
def test_bounds(fields: dict[str, float]) -> None:
    with pytest.raises(ValidationError):
        WorkerSettings(**fields)  # type: ignore[arg-type]


def test_zero_is_allowed_where_documented() -> None:
    w = WorkerSettings(crash_loop_restarts=0, stop_timeout_s=0, stream_interval_s=0)
    assert (w.crash_loop_restarts, w.stop_timeout_s, w.stream_interval_s) == (0, 0, 0)


def test_python_expands_user(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    w = WorkerSettings(python=Path("~/.venv/bin/python"))
    assert w.python == tmp_path / ".venv/bin/python"
