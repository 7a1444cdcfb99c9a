"""``servehall.plugin.migrations.MigrationBranch``: where a branch's revision files are,
from a plain path or ``"package:subdir"`` inside an installed package."""

from __future__ import annotations

from pathlib import Path

import pytest

import servehall
from servehall.plugin.migrations import CORE_BASE_REVISION, MigrationBranch


def test_package_location_resolves_inside_the_package() -> None:
    where = MigrationBranch("core", "servehall:migrations/versions").path()
    assert where == Path(servehall.__file__).parent / "migrations" / "versions"
    assert where.is_dir()
    assert MigrationBranch("core", "servehall:/migrations//versions/").path() == where


def test_plain_paths_are_kept(tmp_path: Path) -> None:
    assert MigrationBranch("x", tmp_path).path() == tmp_path
    assert MigrationBranch("x", str(tmp_path)).path() == tmp_path
    assert MigrationBranch("x", "relative/dir").path() == Path("relative/dir")
    # An absolute path with a colon in it is a path, not a package reference.
    odd = tmp_path / "a:b"
    assert MigrationBranch("x", str(odd)).path() == odd


def test_a_missing_package_is_an_error() -> None:
    with pytest.raises(ModuleNotFoundError):
        MigrationBranch("x", "no_such_package_r7:migrations").path()


def test_the_core_base_revision_exists() -> None:
    versions = Path(servehall.__file__).parent / "migrations" / "versions"
    assert any(CORE_BASE_REVISION in p.read_text() for p in versions.glob("*.py"))
    assert MigrationBranch("x", "p").metadata is None
