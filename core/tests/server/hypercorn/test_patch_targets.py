"""The connection patches' targets are checked at start, and pinned (issue 26 item 5)."""

from __future__ import annotations

import tomllib
from importlib.metadata import version
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from servehall.server.hypercorn.patch_targets import (
    TARGETS,
    PatchTarget,
    PatchTargetError,
    check_patch_targets,
)

PYPROJECT = Path(__file__).resolve().parents[3] / "pyproject.toml"


def test_installed_libraries_match_every_patch() -> None:
    check_patch_targets(tuple(t for t in TARGETS))
    assert {t.patch for t in TARGETS} == {
        "conn_release",
        "h1_early_response",
        "h2_refused_stream",
        "h2_workaround",
        "h2_scheduler",
        "h2_headers",
        "h2_direct_data",
        "h2_incomplete_reset",
        "write_coalesce",
    }


def test_a_missing_internal_is_a_clear_error() -> None:
    gone = PatchTarget("h2_workaround", "hypercorn", "hypercorn.protocol.h2", "H2Protocol._gone")
    with pytest.raises(PatchTargetError) as ei:
        check_patch_targets((gone,))
    msg = str(ei.value)
    assert (
        "servehall.server.hypercorn.h2_workaround" in msg and "H2Protocol._gone is missing" in msg
    )
    assert f"hypercorn {version('hypercorn')}" in msg


def test_changed_code_is_a_clear_error() -> None:
    # a method no patch replaces: a patched one is skipped in a process that already
    # patched it (any in-process server test before this one, e.g. under xdist)
    changed = PatchTarget(
        "h2_refused_stream",
        "h2",
        "h2.connection",
        "H2Connection.send_headers",
        ("a line that is not there",),
    )
    with pytest.raises(PatchTargetError) as ei:
        check_patch_targets((changed,))
    assert "no longer contains 'a line that is not there'" in str(ei.value)


def test_patched_libraries_are_pinned_and_declared() -> None:
    deps = tomllib.loads(PYPROJECT.read_text())["project"]["dependencies"]
    reqs = {Requirement(d).name.lower(): Requirement(d) for d in deps}
    for name in ("hypercorn", "h2", "h11", "priority", "hpack"):
        req = reqs[name]
        assert any(s.operator == "<" for s in req.specifier), f"{name} has no upper bound"
        assert req.specifier.contains(version(name)), (name, version(name))
