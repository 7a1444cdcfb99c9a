"""Alembic migrations, run programmatically (``servehall db upgrade``/``status``,
``[database] auto_migrate``, and the schema check ``serve`` does before it accepts
requests).

The Alembic environment and the core's revisions are package data of ``servehall``
(``servehall/migrations``), so an installed wheel migrates exactly like a checkout. The
core's revisions form the main line from ``0001_base``; each plugin that owns tables
ships its revisions in its own package as a branch rooted at ``0001_base`` and declares
it with ``servehall_migrations`` (:class:`~servehall.plugin.migrations.MigrationBranch`).

Every function takes ``branches``: the plugin branches to *apply* (those of the enabled
plugins), and ``known``: branches of installed plugins that are not enabled, used only
to make sense of revisions already in ``alembic_version`` — a disabled plugin's tables
and version row are left alone, never dropped and never upgraded.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
from collections.abc import AsyncIterator, Iterator, Sequence
from importlib.resources import files
from pathlib import Path
from typing import Any

# Alembic logs one INFO line per built-in plugin on import; not useful to operators.
logging.getLogger("alembic.runtime.plugins").setLevel(logging.WARNING)

from alembic import command  # noqa: E402
from alembic.config import Config  # noqa: E402
from alembic.runtime.migration import MigrationContext  # noqa: E402
from alembic.script import ScriptDirectory  # noqa: E402
from sqlalchemy.engine import Connection  # noqa: E402
from sqlalchemy.ext.asyncio import AsyncEngine  # noqa: E402

from servehall.errors import ConfigError, PluginError  # noqa: E402
from servehall.plugin.migrations import MigrationBranch  # noqa: E402

UPGRADE_HINT = "servehall db upgrade"

#: Tries of the schema check when SQLite reports "database is locked" (another process
#: held the write lock past the busy timeout, e.g. a migration or a large record batch).
LOCKED_ATTEMPTS = 3

log = logging.getLogger("servehall.db")

_ALEMBIC = threading.Lock()


@contextlib.asynccontextmanager
async def _alembic_turn() -> AsyncIterator[None]:
    """One Alembic run at a time in this process.

    Alembic keeps the running migration context in module globals (``alembic.context``,
    ``alembic.op``): two runs interleaved in one process — two coroutines whose
    ``run_sync`` switch at every statement (the records sink, the file service and the
    response store each check the schema on first use), or two threads — clobber each
    other (``KeyError: 'script'``). The lock is taken without blocking the event loop; a
    waiter cancelled meanwhile gives the lock back as soon as it gets it.
    """
    if not _ALEMBIC.acquire(blocking=False):
        got = asyncio.get_running_loop().run_in_executor(None, _ALEMBIC.acquire)
        try:
            await asyncio.shield(got)
        except asyncio.CancelledError:
            got.add_done_callback(lambda _: _ALEMBIC.release())
            raise
    try:
        yield
    finally:
        _ALEMBIC.release()


CORE_LABEL = "servehall"

#: ``pg_advisory_xact_lock`` key held while migrating, so replicas started together with
#: ``auto_migrate`` run the migrations one after the other (the second finds nothing to do).
MIGRATION_LOCK_KEY = 0x5E5E_0001


class SchemaTooNewError(ConfigError):
    """The database is at a revision this servehall does not know: another replica (or
    ``servehall db upgrade``) of a newer release migrated it, or a plugin that owns it is
    not installed. ``database_revisions`` holds the unknown revision(s), ``known_heads``
    this release's head(s)."""

    def __init__(self, database: set[str], code: set[str]) -> None:
        self.database_revisions = database
        self.known_heads = code
        super().__init__(
            "database schema is newer than this servehall: the database is at revision "
            + ", ".join(sorted(database))
            + ", this release knows up to "
            + ", ".join(sorted(code))
            + "; run the newer servehall release on this replica (a replica never "
            "downgrades a shared database), or install the plugin that owns the revision "
            "(it may stay disabled)"
        )


def migrations_dir() -> Path:
    """The Alembic environment shipped in the package (``servehall/migrations``)."""
    return Path(str(files("servehall").joinpath("migrations")))


def _branch_dir(branch: MigrationBranch) -> Path:
    try:
        path = branch.path()
    except (ModuleNotFoundError, TypeError, ValueError) as exc:
        raise PluginError(
            f"plugin {branch.label!r}: migration branch location {branch.location!r} "
            f"cannot be found ({type(exc).__name__}: {exc})"
        ) from None
    if not path.is_dir() or not any(path.glob("*.py")):
        raise PluginError(
            f"plugin {branch.label!r}: migration branch {branch.label!r} is missing "
            f"(no revision files in {path})"
        )
    return path


class MigrationPlan:
    """The migration tree for one deployment: core + plugin branches.

    Args:
        branches: plugin branches to apply.
        known: plugin branches only to resolve revisions already applied.

    Raises:
        PluginError: a branch's directory is missing or empty, its revisions do not form
            a branch with its label, or Alembic cannot read them (one line naming the
            plugin).
    """

    def __init__(
        self,
        branches: Sequence[MigrationBranch] = (),
        known: Sequence[MigrationBranch] = (),
        *,
        complete: bool = False,
    ) -> None:
        self.complete = complete
        mdir = migrations_dir()
        self.dirs: dict[str, Path] = {CORE_LABEL: mdir / "versions"}
        self.apply: list[str] = [CORE_LABEL]
        for b in branches:
            self.dirs[b.label] = _branch_dir(b)
            self.apply.append(b.label)
        for b in known:
            if b.label in self.dirs:
                continue
            with contextlib.suppress(PluginError):  # a broken disabled plugin: ignore it
                self.dirs[b.label] = _branch_dir(b)
        cfg = Config()
        cfg.set_main_option("script_location", str(mdir))
        cfg.set_main_option("path_separator", "os")
        cfg.set_main_option(
            "version_locations", os.pathsep.join(str(d) for d in self.dirs.values())
        )
        self.config = cfg
        try:
            self.script = ScriptDirectory.from_config(cfg)
            revisions = list(self.script.walk_revisions())
        except Exception as exc:
            names = ", ".join(repr(n) for n in self.dirs if n != CORE_LABEL) or "none"
            raise PluginError(
                f"migration tree cannot be read (plugin branches: {names}): "
                f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            ) from None
        by_dir: dict[Path, list[Any]] = {}
        for rev in revisions:
            by_dir.setdefault(Path(rev.path).resolve().parent, []).append(rev)
        self.heads: dict[str, list[str]] = {}
        for label, d in self.dirs.items():
            revs = by_dir.get(d.resolve(), [])
            ids = {r.revision for r in revs}
            if label != CORE_LABEL and not any(label in (r.branch_labels or ()) for r in revs):
                raise PluginError(
                    f"plugin {label!r}: migration branch {label!r} is missing "
                    f"(no revision in {d} has branch_labels = ({label!r},))"
                )
            self.heads[label] = sorted(r.revision for r in revs if not (set(r.nextrev) & ids))
        self.revisions = {r.revision for r in revisions}
        core_dir = self.dirs[CORE_LABEL].resolve()
        self.core_revisions = {r.revision for r in by_dir.get(core_dir, [])}

    def targets(self) -> list[str]:
        """Head revisions to reach: the core's and each applied branch's."""
        return [h for label in self.apply for h in self.heads[label]]

    def check_current(self, current: set[str], *, strict: bool = True) -> None:
        """Refuse a database holding revisions this tree lacks (SchemaTooNewError).

        Not ``strict`` (a plan that may not know every installed plugin, e.g. the core-only
        check of the ``sql`` sink): unknown revisions beside a known core revision belong
        to other branches and are ignored; an unknown core line is still refused."""
        unknown = current - self.revisions
        if not unknown:
            return
        if not strict and not self.complete and current & self.core_revisions:
            return
        raise SchemaTooNewError(unknown, set(self.targets()))

    def missing(self, conn: Connection) -> set[str]:
        """Target heads the database has not reached (revisions of branches outside this
        tree, e.g. a plugin the caller does not know about, are ignored)."""
        current = set(MigrationContext.configure(conn).get_current_heads())
        self.check_current(current, strict=False)
        current &= self.revisions
        applied: set[str] = set()
        for rev in current:
            for r in self.script.iterate_revisions(rev, "base"):
                applied.add(r.revision)
        return {h for h in self.targets() if h not in applied}

    def status(self, conn: Connection) -> list[tuple[str, list[str], bool, bool]]:
        """``[(label, heads, applied?, enabled?)]`` for every branch in the tree."""
        current = set(MigrationContext.configure(conn).get_current_heads())
        self.check_current(current, strict=False)
        current &= self.revisions
        applied: set[str] = set()
        for rev in current:
            for r in self.script.iterate_revisions(rev, "base"):
                applied.add(r.revision)
        return [
            (label, heads, all(h in applied for h in heads), label in self.apply)
            for label, heads in self.heads.items()
        ]

    def upgrade(self, conn: Connection) -> None:
        """Upgrade to every target head (core first, then plugin branches in order)."""
        if conn.dialect.name == "postgresql":
            conn.exec_driver_sql(f"SELECT pg_advisory_xact_lock({MIGRATION_LOCK_KEY})")
        # refuse revisions no package provides before Alembic trips over them
        self.check_current(set(MigrationContext.configure(conn).get_current_heads()))
        self.config.attributes["connection"] = conn
        for head in self.targets():
            command.upgrade(self.config, head)


def script_heads() -> set[str]:
    """The core's head revision(s) in this release."""
    return set(MigrationPlan().targets())


async def upgrade_database(
    engine: AsyncEngine,
    branches: Sequence[MigrationBranch] = (),
    known: Sequence[MigrationBranch] = (),
    *,
    complete: bool = False,
) -> None:
    """Apply the core's revisions and ``branches`` on ``engine``'s database (one transaction;
    on PostgreSQL under an advisory lock, so concurrent replicas migrate one at a time).

    ``complete``: ``branches`` + ``known`` cover every installed plugin (the host's view);
    then any unknown revision means a newer schema."""
    plan = MigrationPlan(branches, known, complete=complete)
    async with _alembic_turn(), engine.begin() as conn:
        await conn.run_sync(plan.upgrade)


@contextlib.contextmanager
def _quiet_alembic() -> Iterator[None]:
    """Silence Alembic's INFO chatter ("Context impl …") while only checking."""
    logger = logging.getLogger("alembic")
    old = logger.level
    logger.setLevel(logging.WARNING)
    try:
        yield
    finally:
        logger.setLevel(old)


async def pending_heads(
    engine: AsyncEngine,
    branches: Sequence[MigrationBranch] = (),
    known: Sequence[MigrationBranch] = (),
    *,
    complete: bool = False,
) -> set[str]:
    """Head revisions (core + ``branches``) the database lacks (empty: fully migrated).

    Raises:
        SchemaTooNewError: the database has a revision the tree does not contain (only
            core revisions count unless ``complete``)."""
    plan = MigrationPlan(branches, known, complete=complete)
    with _quiet_alembic():
        async with _alembic_turn(), engine.connect() as conn:
            return await conn.run_sync(plan.missing)


async def branch_status(
    engine: AsyncEngine,
    branches: Sequence[MigrationBranch] = (),
    known: Sequence[MigrationBranch] = (),
    *,
    complete: bool = False,
) -> list[tuple[str, list[str], bool, bool]]:
    """``[(label, heads, applied, enabled)]`` per branch, for ``servehall db status``."""
    plan = MigrationPlan(branches, known, complete=complete)
    with _quiet_alembic():
        async with _alembic_turn(), engine.connect() as conn:
            return await conn.run_sync(plan.status)


async def ensure_schema(
    engine: AsyncEngine,
    *,
    auto_migrate: bool,
    config_hint: str = "",
    branches: Sequence[MigrationBranch] = (),
    known: Sequence[MigrationBranch] = (),
    complete: bool = False,
) -> None:
    """Make sure the schema is current: migrate when ``auto_migrate``, else refuse.

    Raises:
        ConfigError: the database is not migrated (the message names the command to run),
            holds revisions of an uninstalled plugin, or cannot be reached.
        PluginError: a plugin's migration branch is missing or broken.
    """
    for attempt in range(LOCKED_ATTEMPTS):
        try:
            missing = await pending_heads(engine, branches, known, complete=complete)
            if missing and auto_migrate:
                await upgrade_database(engine, branches, known, complete=complete)
                missing = await pending_heads(engine, branches, known, complete=complete)
            break
        except (ConfigError, PluginError):
            raise
        except Exception as exc:
            if _locked(exc) and attempt + 1 < LOCKED_ATTEMPTS:
                log.warning("database: the schema check met a locked SQLite file; retrying")
                await asyncio.sleep(0.5 * (attempt + 1))
                continue
            raise ConfigError(f"database: cannot check the schema: {_brief(exc)}") from None
    if missing:
        raise ConfigError(
            "database is not migrated (missing revision(s): "
            + ", ".join(sorted(missing))
            + f"); run `{UPGRADE_HINT}{config_hint}` (with the same --config) first, or set "
            "[database] auto_migrate = true"
        )


def _locked(exc: BaseException) -> bool:
    """Whether ``exc`` (or what it wraps) is SQLite's "database is locked"."""
    seen: BaseException | None = exc
    while seen is not None:
        if "database is locked" in str(seen):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


async def open_checked(settings: Any, plugins: Any = None) -> AsyncEngine:
    """A database engine for ``settings`` with its schema checked (and migrated when
    ``[database] auto_migrate``), including the migration branches of ``plugins`` (a
    :class:`~servehall.plugin.manager.PluginHost`, or None) — what a service that opens
    the database on first use (files, stored responses) needs.

    Raises:
        ConfigError: bad URL, unreachable database or schema not current (the engine
            is disposed).
        PluginError: a plugin's migration branch is missing or broken.
    """
    from servehall.db.engine import create_db_engine

    engine = create_db_engine(settings)
    try:
        await ensure_schema(
            engine,
            auto_migrate=settings.database.auto_migrate,
            branches=plugins.migrations() if plugins is not None else (),
            known=plugins.other_migrations() if plugins is not None else (),
        )
    except BaseException:
        await engine.dispose()
        raise
    return engine


def _brief(exc: BaseException) -> str:
    text: Any = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {text}"[:300]
