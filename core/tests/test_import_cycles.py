"""Every module under ``servehall`` imports, and no cycle of runtime imports joins them.

A runtime import is one executed when the module is imported: at module level, outside
``if TYPE_CHECKING:`` (imports inside functions run later, on first use, and are not
counted). The graph's edges are the explicit ``import servehall.x`` / ``from servehall.x
import y`` statements (to ``servehall.x.y`` when ``y`` is a module, else to
``servehall.x``; a package is always imported before its modules, so that implicit edge
is not counted); a strongly connected component of more than one module is a cycle and
fails the test with its members.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
from pathlib import Path

import pytest

import servehall

ROOT = Path(servehall.__file__).parent
SKIP = ("servehall.migrations",)  # Alembic scripts: run by Alembic, not imported


def _modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for path in sorted(ROOT.rglob("*.py")):
        parts = ("servehall", *path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        name = ".".join(parts)
        if not name.startswith(SKIP):
            found[name] = path
    return found


MODULES = _modules()


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _runtime_imports(name: str, path: Path) -> set[str]:
    """The servehall modules ``name`` imports at module level."""
    tree = ast.parse(path.read_text(), str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    deps: set[str] = set()

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, ast.Import):
                deps.update(a.name for a in node.names if a.name in MODULES)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*anchor, *([base] if base else [])])
                submodules = {f"{base}.{a.name}" for a in node.names} & MODULES.keys()
                deps.update(submodules)
                if base in MODULES and len(submodules) < len(node.names):
                    deps.add(base)  # names defined in ``base`` itself
            elif isinstance(node, ast.If) and not _is_type_checking(node.test):
                visit(node.body)
                visit(node.orelse)
            elif isinstance(node, ast.If):
                visit(node.orelse)
            elif isinstance(node, ast.Try):
                visit(node.body)
                for handler in node.handlers:
                    visit(handler.body)
                visit(node.orelse)
                visit(node.finalbody)

    visit(tree.body)
    deps.discard(name)
    return deps


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one node (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component: list[str] = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return found


def test_no_cycle_of_runtime_imports() -> None:
    graph = {name: _runtime_imports(name, path) for name, path in MODULES.items()}
    assert _cycles(graph) == []


def test_cycle_finder_finds_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


@pytest.mark.parametrize("name", sorted(MODULES))
def test_every_module_imports(name: str) -> None:
    if importlib.util.find_spec(name) is None:  # pragma: no cover - listing is from disk
        pytest.fail(f"{name} is not importable")
    importlib.import_module(name)


FORBIDDEN: tuple[tuple[str, str], ...] = (
    ("servehall.rollout", "servehall.server"),  # versions start and stop in servehall.host
    ("servehall.plugin", "servehall.rollout"),  # OutcomeWindow, Breach: servehall.plugin.outcomes
    # the per-request state is handed its reporting (trace, record, guard) as listeners
    ("servehall.serving", "servehall.rollout"),
    ("servehall.serving", "servehall.api"),
)
"""(importer, imported) package pairs: no module under the first imports one under the
second, at module level, inside a function or under ``TYPE_CHECKING``."""


def _under(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def _every_import(name: str, path: Path) -> set[str]:
    """The servehall modules ``name`` names in any import statement (lazy and
    ``TYPE_CHECKING`` ones included; relative imports resolved)."""
    tree = ast.parse(path.read_text(), str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            found.add(base)
            found.update(f"{base}.{a.name}" for a in node.names)
    return {f for f in found if _under(f, "servehall")}


def _layer_breaks(modules: dict[str, Path]) -> list[str]:
    breaks: list[str] = []
    for name, path in modules.items():
        imported = _every_import(name, path)
        for low, high in FORBIDDEN:
            if _under(name, low):
                breaks += [f"{name} imports {m}" for m in sorted(imported) if _under(m, high)]
    return breaks


def test_no_import_across_forbidden_layers() -> None:
    assert _layer_breaks(MODULES) == []


def test_layer_check_sees_lazy_and_type_checking_imports(tmp_path: Path) -> None:
    lazy = tmp_path / "idle.py"
    lazy.write_text("def f():\n    from servehall.server.serve import run\n")
    typed = tmp_path / "host.py"
    typed.write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..rollout import guard\n"
    )
    found = _layer_breaks({"servehall.rollout.idle": lazy, "servehall.plugin.host": typed})
    assert found == [
        "servehall.rollout.idle imports servehall.server.serve",
        "servehall.rollout.idle imports servehall.server.serve.run",
        "servehall.plugin.host imports servehall.rollout",
        "servehall.plugin.host imports servehall.rollout.guard",
    ]


def _servehall_imports(path: Path) -> set[str]:
    """The servehall modules (or packages) a file's import statements name."""
    tree = ast.parse(path.read_text(), str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if _under(a.name, "servehall"))
        elif isinstance(node, ast.ImportFrom) and _under(node.module or "", "servehall"):
            found.add(node.module or "")
    return found


def test_inference_endpoint_stays_a_few_calls() -> None:
    """The inference endpoint hands its work to the input processor
    (``servehall.api.prepare``), admission and the output side (issue 35): its request
    path is at most 60 lines, and the module imports at most 12 servehall modules."""
    path = MODULES["servehall.api.inference"]
    tree = ast.parse(path.read_text(), str(path))
    handle = next(
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.AsyncFunctionDef | ast.FunctionDef) and n.name == "_handle"
    )
    assert handle.end_lineno is not None
    assert handle.end_lineno - handle.lineno + 1 <= 60
    assert len(_servehall_imports(path)) <= 12, sorted(_servehall_imports(path))
