"""Tests of the servehall.server.hypercorn package: ``install_connection_fixes`` checks the
patch targets, then installs every fix once — run in a fresh interpreter, so the
unpatched Hypercorn/h2/h11 can be compared with the patched ones."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import servehall

CHILD = r"""
import importlib, json
from servehall.server.hypercorn import patch_targets

def resolve(t):
    obj = importlib.import_module(t.module)
    for part in t.qualname.split("."):
        obj = getattr(obj, part)
    return obj

targets = patch_targets.TARGETS
before = [id(resolve(t)) for t in targets]
from servehall.server.hypercorn import install_connection_fixes
import servehall.server.hypercorn as pkg
flags_before = {m: getattr(pkg, m)._INSTALLED for m in (
    "conn_release", "h1_early_response", "h2_refused_stream", "h2_workaround",
    "h2_scheduler", "write_coalesce", "h2_headers", "h2_direct_data",
    "h2_incomplete_reset")}
install_connection_fixes()
after = [id(resolve(t)) for t in targets]
install_connection_fixes()
again = [id(resolve(t)) for t in targets]
flags_after = {m: getattr(pkg, m)._INSTALLED for m in flags_before}
changed = sorted({t.patch for t, b, a in zip(targets, before, after) if b != a})
print(json.dumps({
    "patches": sorted({t.patch for t in targets}),
    "changed": changed,
    "stable": after == again,
    "flags_before": flags_before,
    "flags_after": flags_after,
}))
"""


def test_every_fix_is_installed_once() -> None:
    env = {**os.environ, "PYTHONPATH": str(Path(servehall.__file__).parent.parent)}
    out = subprocess.run(
        [sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    assert not any(got["flags_before"].values())
    assert all(got["flags_after"].values())
    # every fix module replaced at least one of the callables it declares as a target
    assert got["changed"] == got["patches"]
    assert got["stable"]  # a second call patches nothing again (no double wrapping)
