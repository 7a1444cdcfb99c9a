"""What a plugin that owns tables declares: :class:`MigrationBranch`.

A plugin ships its Alembic revisions inside its own package, as a branch of the shared
migration tree: the branch's first revision has ``down_revision = "0001_base"`` (the
core's root) and ``branch_labels = ("<plugin name>",)``; later revisions chain from it.
It declares the branch through ``servehall_migrations``::

    from servehall import MigrationBranch, hookimpl

    @hookimpl
    def servehall_migrations():
        return [MigrationBranch("webhook_sink", "servehall_webhook_sink:migrations")]

``servehall db upgrade`` (and ``[database] auto_migrate``) then applies the core's
revisions and the branch of every *enabled* plugin; disabling a plugin leaves its tables
and its row in ``alembic_version`` alone (nothing is ever dropped).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sqlalchemy import MetaData

CORE_BASE_REVISION = "0001_base"
"""The core's root revision; every plugin branch starts from it."""


@dataclass(frozen=True, slots=True)
class MigrationBranch:
    """One plugin's Alembic branch.

    Attributes:
        label: the branch label (``branch_labels`` of its first revision); must be the
            plugin's entry-point name.
        location: the directory holding the revision files: a path, or
            ``"package:subdir"`` (a directory inside an installed package, found with
            :func:`importlib.resources.files`, so it works from a wheel).
        metadata: returns the SQLAlchemy ``MetaData`` of the branch's tables, for the
            "migration matches the table definitions" check of the conformance kit
            (:func:`servehall.testing.migrations.schema_diff`); None to skip it.
    """

    label: str
    location: str | Path
    metadata: Callable[[], MetaData] | None = None

    def path(self) -> Path:
        """The revision directory on disk (it may not exist: callers check).

        Raises:
            ModuleNotFoundError: ``"package:subdir"`` names a package that is not installed.
        """
        loc = self.location
        if isinstance(loc, str) and ":" in loc and not Path(loc).is_absolute():
            package, _, sub = loc.partition(":")
            return Path(str(files(package).joinpath(*[p for p in sub.split("/") if p])))
        return Path(loc)
