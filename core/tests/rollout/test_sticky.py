"""Canary rollbacks that stick in config texts (:mod:`servehall.rollout.sticky`): the
guard's mark, and the rule that keeps it through later configs."""

from __future__ import annotations

import tomllib
from typing import Any

import pytest
import yaml

from servehall.config.models import ModelConfig
from servehall.rollout.sticky import keep, mark, rolled_back

FILE = """\
# the deployment
[server]
config_revisions = true

[[models]]
name = "m"
version = "v1"
weight = 90 # the stable one
path = "/models/m1"

[[models]]
name = "m"
version = "c"
weight = 10
path = "/models/m2"

[models.rollback_if]
error_rate_above = 0.1
"""

MARKER = {"reason": "error_rate", "detail": "error rate 0.5 > 0.1 over 10 requests", "by": "r1"}


def _models(text: str, fmt: str = "toml") -> list[dict[str, Any]]:
    data = tomllib.loads(text) if fmt == "toml" else yaml.safe_load(text)
    return list(data["models"])


def _entry(text: str, version: str, fmt: str = "toml") -> dict[str, Any]:
    return next(e for e in _models(text, fmt) if e.get("version") == version)


def test_mark_sets_weight_0_and_keeps_the_old_weight_and_the_layout() -> None:
    out = mark(FILE, "toml", "m", "c", MARKER)
    assert out is not None
    c = _entry(out, "c")
    assert c["weight"] == 0
    assert c["rolled_back"] == {"weight": 10, **MARKER}
    ModelConfig.model_validate(c)  # a valid [[models]] entry
    assert _entry(out, "v1") == _entry(FILE, "v1")
    assert "weight = 90 # the stable one" in out and out.startswith("# the deployment")
    assert mark(out, "toml", "m", "c", MARKER) is None  # already at 0: nothing to store
    assert mark(FILE, "toml", "m", "nope", MARKER) is None


def test_mark_never_takes_the_last_weighted_version_of_a_name() -> None:
    only = FILE.replace("weight = 90 # the stable one", "weight = 0")
    assert mark(only, "toml", "m", "c", MARKER) is None


def test_an_unrelated_config_keeps_the_rollback() -> None:
    stored = mark(FILE, "toml", "m", "c", MARKER)
    assert stored is not None
    # the operator's file, changed elsewhere, still says weight = 10 for c
    edited = FILE.replace("weight = 90 # the stable one", "weight = 80")
    out, kept = keep(edited, "toml", _models(stored))
    assert kept == ["m@c"]
    assert _entry(out, "c")["weight"] == 0
    assert _entry(out, "c")["rolled_back"]["weight"] == 10
    assert _entry(out, "v1")["weight"] == 80
    # a replica restarting from the very file the rollback was made from stores the same
    # text as the rollback's revision (so it adopts that revision)
    assert keep(FILE, "toml", _models(stored)) == (stored, ["m@c"])


@pytest.mark.parametrize("weight", ["5", "0"])
def test_another_weight_is_explicit(weight: str) -> None:
    stored = mark(FILE, "toml", "m", "c", MARKER)
    assert stored is not None
    explicit = FILE.replace("weight = 10", f"weight = {weight}")
    assert keep(explicit, "toml", _models(stored)) == (explicit, [])


def test_the_stored_text_edited_back_ends_the_rollback() -> None:
    stored = mark(FILE, "toml", "m", "c", MARKER)
    assert stored is not None
    back = stored.replace("weight = 0\n", "weight = 10\n")
    out, kept = keep(back, "toml", _models(stored))
    assert kept == [] and "rolled_back" not in _entry(out, "c")
    assert _entry(out, "c")["weight"] == 10
    # posted back unchanged (weight 0 and the table): stays as it is
    assert keep(stored, "toml", _models(stored)) == (stored, [])


def test_a_config_that_makes_the_canary_the_only_weighted_version_is_explicit() -> None:
    stored = mark(FILE, "toml", "m", "c", MARKER)
    assert stored is not None
    only_c = FILE.replace("weight = 90 # the stable one", "weight = 0")
    assert keep(only_c, "toml", _models(stored)) == (only_c, [])


def test_nothing_to_keep_returns_the_text_itself() -> None:
    assert keep(FILE, "toml", _models(FILE)) == (FILE, [])
    assert rolled_back(_models(FILE)) == {}


def test_yaml_and_an_implicit_weight() -> None:
    text = yaml.safe_dump(
        {
            "models": [
                {"name": "m", "version": "v1", "path": "/a"},  # weight 1 by default
                {"name": "m", "version": "c", "path": "/b"},
            ]
        },
        sort_keys=False,
    )
    stored = mark(text, "yaml", "m", "c", MARKER)
    assert stored is not None
    assert _entry(stored, "c", "yaml")["rolled_back"] == {"weight": 1.0, **MARKER}
    out, kept = keep(text, "yaml", _models(stored, "yaml"))
    assert kept == ["m@c"] and out == stored
    assert _entry(out, "c", "yaml")["weight"] == 0
