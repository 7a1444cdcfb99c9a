"""``servehall.config.check``: every problem of a config in one run — core type errors
with stable ``[[list]]`` indexes while bad entries are set aside, unknown plugins
without their sections being called unknown too, plugin sections, names, and the file
and environment errors."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from servehall.config.check import _original_loc, _set_aside, check_config, check_config_data


def _keys(errs: list[tuple[str, str]]) -> list[str]:
    return [k for k, _ in errs]


def test_valid_config_has_no_problems(tmp_path: Path) -> None:
    assert check_config_data({}) == []
    cfg = tmp_path / "ok.toml"
    cfg.write_text('[scheduler]\npolicy = "fair"\n')
    assert check_config(cfg) == []


def test_unreadable_and_unparsable_files_are_one_error(tmp_path: Path) -> None:
    missing = check_config(tmp_path / "none.toml")
    assert len(missing) == 1 and missing[0][0] == "file"
    bad = tmp_path / "bad.toml"
    bad.write_text("[server\n")
    errs = check_config(bad)
    assert len(errs) == 1 and errs[0][0] == "file"
    assert not errs[0][1].startswith(str(bad))


def test_every_list_entry_error_keeps_its_index() -> None:
    data: dict[str, Any] = {
        "models": [
            {"name": "a", "path": "/m"},
            {"name": 3, "path": "/m"},
            {"name": "b", "path": "/m", "max_model_len": "long"},
            {"name": "c"},
        ],
        "server": {"bind": 5},
    }
    errs = check_config_data(data)
    keys = _keys(errs)
    assert "models[1].name" in keys
    assert "models[2].max_model_len" in keys
    assert "models[3].path" in keys
    assert "server.bind" in keys
    assert not any(k.startswith("models[0]") for k in keys)
    assert len(keys) == len(set(errs))  # each reported once
    # The caller's data is not changed.
    assert data["models"][1] == {"name": 3, "path": "/m"}


def test_names_are_checked_after_type_errors() -> None:
    errs = check_config_data(
        {"scheduler": {"policy": "wfq", "max_queue": -3}, "sinks": [{"name": "kafka"}]}
    )
    keys = _keys(errs)
    assert keys.index("scheduler.max_queue") < keys.index("scheduler.policy")
    assert "sinks[0].name" in keys
    assert any("unknown policy 'wfq'" in m for _, m in errs)


def test_unknown_plugin_reported_and_its_section_not_called_unknown() -> None:
    errs = check_config_data(
        {"plugins": {"enabled": ["no_such", "auth"]}, "no_such": {"x": 1}, "auth": {"bogus": 1}}
    )
    assert _keys(errs) == ["plugins.enabled", "auth.bogus"]
    assert "unknown plugin 'no_such'" in errs[0][1] and "auth" in errs[0][1]


def test_unknown_section() -> None:
    errs = check_config_data({"mystery": {"a": 1}})
    assert _keys(errs) == ["mystery"]
    assert "unknown config section" in errs[0][1]


def test_environment_override_that_is_not_json(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SERVEHALL_SERVER__BIND", "[not json")
    errs = check_config_data({})
    assert len(errs) == 1
    key, msg = errs[0]
    assert key == "server" and "SERVEHALL_SERVER__BIND" in msg and "must be JSON" in msg


def test_set_aside() -> None:
    data: dict[str, Any] = {"models": [{"a": 1}, {"b": 2}], "server": {"x": 1, "y": 2}, "s": 3}
    assert _set_aside(data, ("models", 1, "b"))
    assert data["models"] == [{"a": 1}, None]
    assert not _set_aside(data, ("models", 1))  # already set aside
    assert not _set_aside(data, ("models", 7))
    assert _set_aside(data, ("server", "x"))
    assert data["server"] == {"y": 2}
    assert _set_aside(data, ("s",))
    assert "s" not in data
    assert _set_aside(data, ("server", "nope"))  # not a key of it: the whole section
    assert "server" not in data
    assert not _set_aside(data, ())
    assert not _set_aside(data, ("absent", "x"))
    assert not _set_aside(data, (0,))


def test_original_loc_maps_past_set_aside_entries() -> None:
    data: dict[str, Any] = {"models": [None, {"a": 1}, None, {"b": 2}]}
    assert _original_loc(data, ("models", 0, "name")) == ("models", 1, "name")
    assert _original_loc(data, ("models", 1)) == ("models", 3)
    assert _original_loc(data, ("models", 5)) == ("models", 5)
    assert _original_loc(data, ("server", "bind")) == ("server", "bind")


def test_entries_set_aside_in_one_round_are_the_bad_ones() -> None:
    # Round 1 finds models[0].name and models[1].worker and sets both entries aside
    # (not models[2], which the shifted cleaned list would point at); round 2 then finds
    # nothing new, and no error is named by a cleaned-list index.
    bad_worker = {"heartbeat_interval_s": 1, "heartbeat_timeout_s": 0.5}
    errs = check_config_data(
        {
            "models": [
                {"name": 3, "path": "/m"},
                {"name": "a", "path": "/m", "worker": bad_worker},
                {"name": "a", "path": "/m"},
            ]
        }
    )
    assert _keys(errs) == ["models[0].name", "models[1].worker"]


def test_name_errors_after_a_set_aside_entry_keep_the_file_index() -> None:
    # models[0] and sinks[0] have type errors and are set aside; the version, weight,
    # backend and sink-name errors of later entries name their index in the file, not
    # the index in the shorter list that is checked.
    errs = check_config_data(
        {
            "models": [
                {"name": 3, "path": "/m"},
                {"name": "a", "path": "/m"},
                {"name": "a", "path": "/m", "version": "v1"},
                {"name": "a", "path": "/m", "version": "v1"},
                {"name": "b", "path": "/m", "weight": 0},
                {"name": "c", "path": "/m", "backend": "nope"},
            ],
            "sinks": [{"name": 7}, {"name": "kafka"}],
        }
    )
    keys = _keys(errs)
    assert "models[0].name" in keys and "sinks[0].name" in keys
    assert "models[1].version" in keys
    assert "models[3].version" in keys
    assert ("models[3].version", "version 'v1' of model 'a' is already models[2]") in errs
    assert "models[4].weight" in keys
    assert "models[5].backend" in keys
    assert "sinks[1].name" in keys
    assert not any(k.startswith("models[2]") for k in keys)
    assert len(keys) == len(set(errs))
