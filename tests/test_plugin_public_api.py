"""Every plugin (the workspace's and the example) imports only the core's public API:
names in ``__all__`` of the modules in ``servehall.PUBLIC_MODULES``, never an underscore
name, a non-public module, or another plugin."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

import servehall

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = sorted(
    p for p in [*ROOT.glob("plugins/*/src/*"), *ROOT.glob("examples/*/src/*")] if p.is_dir()
)


def _public_names(module: str) -> set[str] | None:
    names = getattr(importlib.import_module(module), "__all__", None)
    return set(names) if names is not None else None


def _violations(package: Path) -> list[str]:
    own = package.name
    out: list[str] = []
    for path in sorted(package.rglob("*.py")):
        if "migrations" in path.relative_to(package).parts:
            continue  # Alembic revision files import alembic/sqlalchemy only
        where = path.relative_to(ROOT)
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                pairs = [(a.name, None) for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                pairs = [(node.module, a.name) for a in node.names]
            else:
                continue
            for module, name in pairs:
                top = module.split(".")[0]
                if top == own or not top.startswith("servehall"):
                    continue
                line = f"{where}:{node.lineno}"
                if top != "servehall":
                    out.append(f"{line}: imports another plugin ({module})")
                    continue
                kit = module.startswith("servehall.testing.")  # the conformance kit's modules
                if module not in servehall.PUBLIC_MODULES and not kit:
                    out.append(f"{line}: imports non-public module {module}")
                    continue
                if name is None:
                    continue
                if name.startswith("_"):
                    out.append(f"{line}: imports underscore name {module}.{name}")
                    continue
                public = _public_names(module)
                if public is not None and name not in public:
                    out.append(f"{line}: {module}.{name} is not in {module}.__all__")
    return out


def test_there_are_plugins_to_check() -> None:
    names = {p.name for p in PACKAGES}
    assert {
        "servehall_auth",
        "servehall_cuda",
        "servehall_rocm",
        "servehall_ascend_stub",
        "servehall_webhook_sink",
        "servehall_safety_filter",
    } <= names


@pytest.mark.parametrize("package", PACKAGES, ids=[p.name for p in PACKAGES])
def test_plugin_imports_only_public_api(package: Path) -> None:
    assert _violations(package) == []


def test_checker_catches_private_imports(tmp_path: Path) -> None:
    pkg = tmp_path / "servehall_bad"
    pkg.mkdir()
    (pkg / "m.py").write_text(
        "from servehall.engines.torch import TorchDevice\n"
        "from servehall import _LAZY\n"
        "from servehall.devices import TorchDevice as T\n"
        "from servehall import Principal, NotAName\n"
        "import servehall_auth.store\n"
    )
    global ROOT
    old, ROOT = ROOT, tmp_path
    try:
        found = _violations(pkg)
    finally:
        ROOT = old
    assert len(found) == 4, found
    assert "non-public module servehall.engines.torch" in found[0]
