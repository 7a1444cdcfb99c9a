"""Meta-tests (after datasette's test_plugin_hooks_are_documented / _have_tests):
every hook in the contract is documented in docs/hooks.md and has a test_hook_<name>."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from servehall.plugin import hookspecs

ROOT = Path(__file__).resolve().parents[3]
HOOKS = sorted(hookspecs.HOOK_NAMES)


def test_hook_names_cover_the_spec_module() -> None:
    declared = {n for n in dir(hookspecs) if n.startswith("servehall_")}
    assert set(HOOKS) == declared and len(HOOKS) >= 12


@pytest.mark.parametrize("hook", HOOKS)
def test_plugin_hooks_are_documented(hook: str) -> None:
    doc = (ROOT / "docs" / "hooks.md").read_text()
    headings = set(re.findall(r"^### (servehall_\w+)$", doc, re.M))
    assert hook in headings, f"{hook} has no '### {hook}' section in docs/hooks.md"
    spec = getattr(hookspecs, hook)
    assert spec.__doc__ and len(spec.__doc__.strip()) > 40, f"{hook} needs a docstring"


def _test_function_names() -> set[str]:
    names: set[str] = set()
    for folder in ("core/tests", "tests", "plugins"):
        for path in (ROOT / folder).rglob("test_*.py"):
            tree = ast.parse(path.read_text())
            for node in ast.walk(tree):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    names.add(node.name)
    return names


@pytest.mark.parametrize("hook", HOOKS)
def test_plugin_hooks_have_tests(hook: str) -> None:
    wanted = "test_hook_" + hook.removeprefix("servehall_")
    assert any(n == wanted or n.startswith(wanted + "_") for n in _test_function_names()), (
        f"no test named {wanted} for hook {hook}"
    )
