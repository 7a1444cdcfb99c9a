"""Test support for database code (core and plugins): PostgreSQL and SQLite fixtures'
building blocks. Not imported by the server.

* :func:`pg_test_url` — ``$SERVEHALL_TEST_PG_URL`` or the server ``.ci/services.d/
  postgres.sh`` starts (``postgresql+asyncpg://servehall:servehall@127.0.0.1:55432/
  servehall_test``).
* :func:`require_pg` — that URL when the server answers; otherwise the calling test
  **fails** when ``CI=true`` and is skipped elsewhere.
* :func:`pg_execute` — one admin statement on a fresh asyncpg connection.
* :func:`create_pg_database` / :func:`drop_pg_database` — a private database per test
  (the test role has ``CREATEDB``), so parallel test runs never see each other's rows.
* :func:`run_sql` — one statement on any database URL; its rows.
* :func:`reject_rows` / :func:`accept_rows` — make the database refuse the
  ``request_log`` rows that match a condition (a trigger), the way a row with bad
  content is refused: to test the records' quarantine end to end.
* :class:`PgCluster` — a throw-away PostgreSQL cluster of its own (initdb in a temp
  dir, own port) that a test may stop and start, e.g. to simulate an outage, without
  disturbing the shared server.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from sqlalchemy.engine import make_url

from servehall.testing.sockets import free_port

PG_DEFAULT_URL = "postgresql+asyncpg://servehall:servehall@127.0.0.1:55432/servehall_test"


def pg_test_url() -> str:
    """The PostgreSQL URL tests use (``$SERVEHALL_TEST_PG_URL`` or the CI default)."""
    return os.environ.get("SERVEHALL_TEST_PG_URL", PG_DEFAULT_URL)


def _plain_dsn(url: str, database: str | None = None) -> str:
    u = make_url(url).set(drivername="postgresql")
    if database is not None:
        u = u.set(database=database)
    return u.render_as_string(hide_password=False)


async def pg_reachable(url: str, timeout: float = 3.0) -> bool:
    """True when a connection to ``url`` succeeds within ``timeout`` seconds."""
    import asyncpg

    try:
        conn = await asyncpg.connect(_plain_dsn(url), timeout=timeout)
    except (OSError, asyncpg.PostgresError, TimeoutError):
        return False
    await conn.close()
    return True


def pg_port_open(url: str, timeout: float = 2.0) -> bool:
    """True when ``url``'s host:port accepts a TCP connection (no event loop needed)."""
    u = make_url(url)
    try:
        with socket.create_connection((u.host or "127.0.0.1", u.port or 5432), timeout):
            return True
    except OSError:
        return False


def require_pg() -> str:
    """The test PostgreSQL URL; fail (``CI=true``) or skip the test when unreachable."""
    import pytest

    url = pg_test_url()
    if pg_port_open(url):
        return url
    msg = f"PostgreSQL not reachable at {make_url(url).render_as_string(hide_password=True)}"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(msg + " (CI=true: run .ci/services.sh)")
    pytest.skip(msg + " (start it with .ci/services.d/postgres.sh)")
    raise AssertionError("unreachable")  # pragma: no cover


async def pg_execute(
    url: str, sql: str, *, database: str | None = None, timeout: float = 60.0
) -> None:
    """Run one statement (e.g. ``CREATE DATABASE``) on a fresh asyncpg connection.

    Connects to ``url`` (any SQLAlchemy PostgreSQL URL; the driver part is ignored), or
    to ``database`` on the same server when given, within ``timeout`` seconds. Raises
    what asyncpg raises (``OSError``/``asyncpg.PostgresError``/``TimeoutError``).
    """
    import asyncpg

    conn = await asyncpg.connect(_plain_dsn(url, database), timeout=timeout)
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


async def create_pg_database(url: str, prefix: str = "servehall_t") -> str:
    """Create a fresh, uniquely named database next to ``url``'s; its URL."""
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    await pg_execute(url, f'CREATE DATABASE "{name}"')
    return make_url(url).set(database=name).render_as_string(hide_password=False)


async def drop_pg_database(url: str, tries: int = 5) -> None:
    """Drop the database ``url`` names (from a connection to the ``postgres`` db).

    ``WITH (FORCE)`` ends the connections still open to it. A role outside
    ``pg_signal_backend`` may not end an autovacuum worker that happens to be busy there
    (``InsufficientPrivilegeError``), so that error is retried up to ``tries`` times,
    0.5 s apart (the worker is done by then); the last one is raised.
    """
    import asyncio

    import asyncpg

    name = make_url(url).database
    for attempt in range(tries):
        try:
            await pg_execute(
                url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)', database="postgres"
            )
            return
        except (asyncpg.InsufficientPrivilegeError, asyncpg.ObjectInUseError):
            if attempt == tries - 1:
                raise
            await asyncio.sleep(0.5)


async def run_sql(url: str, sql: str) -> list[Any]:
    """Run one SQL statement on ``url`` (any database) in its own committed transaction.

    Returns the result rows (SQLAlchemy ``Row`` tuples) or ``[]`` for a statement that
    returns none (``DELETE``, ``UPDATE``...). Opens and disposes of an engine per call.
    """
    from sqlalchemy import text

    from servehall.db.engine import create_db_engine

    engine = create_db_engine(url)
    try:
        async with engine.begin() as conn:
            res = await conn.execute(text(sql))
            return list(res.all()) if res.returns_rows else []
    finally:
        await engine.dispose()


def wait_rows(url: str, sql: str, n: int, timeout: float = 30.0, every: float = 0.1) -> list[Any]:
    """The rows of ``sql`` on ``url`` once there are at least ``n`` (records are written
    asynchronously), or what there is after ``timeout`` seconds. Synchronous: for tests
    that drive a server in a subprocess. Polls every ``every`` seconds."""
    import asyncio
    import time

    end = time.monotonic() + timeout
    rows: list[Any] = []
    while time.monotonic() < end:
        rows = asyncio.run(run_sql(url, sql))
        if len(rows) >= n:
            break
        time.sleep(every)
    return rows


REJECT_MESSAGE = "servehall test: row rejected by reject_rows()"
"""The error a :func:`reject_rows` trigger raises."""


async def reject_rows(url: str, condition: str) -> None:
    """Make the database at ``url`` refuse every ``request_log`` insert whose new row
    matches ``condition`` — an SQL boolean over ``NEW.<column>``, e.g.
    ``"NEW.tool_calls IS NOT NULL"`` — with an error caused by the row (SQLite:
    ``RAISE(ABORT)``, an integrity error; PostgreSQL: SQLSTATE 22023, a data exception).
    Other rows are written as usual. Undo with :func:`accept_rows`. Test only."""
    if make_url(url).get_backend_name() == "postgresql":
        await run_sql(
            url,
            "CREATE OR REPLACE FUNCTION servehall_test_reject() RETURNS trigger "
            f"LANGUAGE plpgsql AS $$ BEGIN IF {condition} THEN RAISE EXCEPTION "
            f"'{REJECT_MESSAGE}' USING ERRCODE = '22023'; END IF; RETURN NEW; END $$",
        )
        await run_sql(
            url,
            "CREATE TRIGGER servehall_test_reject BEFORE INSERT ON request_log "
            "FOR EACH ROW EXECUTE FUNCTION servehall_test_reject()",
        )
        return
    await run_sql(
        url,
        "CREATE TRIGGER servehall_test_reject BEFORE INSERT ON request_log "
        f"WHEN {condition} BEGIN SELECT RAISE(ABORT, '{REJECT_MESSAGE}'); END",
    )


async def accept_rows(url: str) -> None:
    """Remove the trigger of :func:`reject_rows` (no error when there is none)."""
    await run_sql(
        url,
        "DROP TRIGGER IF EXISTS servehall_test_reject"
        + (" ON request_log" if make_url(url).get_backend_name() == "postgresql" else ""),
    )


def pg_bin_dir() -> Path | None:
    """Directory of the newest installed PostgreSQL server binaries, or None."""
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"))
    if found:
        return found[-1].parent
    initdb = shutil.which("initdb")
    return Path(initdb).resolve().parent if initdb else None


class PgCluster:
    """A private PostgreSQL cluster in ``root`` (trust auth on loopback; test only).

    As root the server runs as the ``postgres`` user (initdb refuses root). ``root``
    defaults to a fresh ``/tmp/servehall-pgc-*`` directory. ``url`` is an asyncpg URL for
    database ``postgres`` as user ``postgres``.
    """

    def __init__(self, root: Path | None = None, port: int | None = None) -> None:
        bindir = pg_bin_dir()
        if bindir is None:
            raise RuntimeError("PostgreSQL server binaries not found")
        self.bin = bindir
        # The server user must reach the directory: pytest's tmp dirs are private to root.
        self.root = root or Path(tempfile.mkdtemp(prefix="servehall-pgc-", dir="/tmp"))
        self.data = self.root / "data"
        self.port = port or free_port()
        self.url = f"postgresql+asyncpg://postgres@127.0.0.1:{self.port}/postgres"
        self._user = "postgres" if os.geteuid() == 0 else None

    def _run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        cmd = [str(self.bin / args[0]), *args[1:]]
        if self._user:
            cmd = ["runuser", "-u", self._user, "--", *cmd]
        done = subprocess.run(cmd, check=False, capture_output=True, text=True, cwd="/")
        if check and done.returncode != 0:
            raise RuntimeError(f"{args[0]} failed ({done.returncode}): {done.stderr.strip()}")
        return done

    def init(self) -> PgCluster:
        """initdb (trust auth, UTF-8)."""
        self.root.mkdir(parents=True, exist_ok=True)
        if self._user:
            shutil.chown(self.root, self._user)
        self._run(
            "initdb",
            "-D",
            str(self.data),
            "-U",
            "postgres",
            "--auth=trust",
            "-E",
            "UTF8",
            "--no-locale",
        )
        return self

    def start(self) -> None:
        """Start on 127.0.0.1:``port`` and wait until it accepts connections."""
        opts = (
            f"-c listen_addresses=127.0.0.1 -p {self.port} "
            f"-c unix_socket_directories={self.root} -c fsync=off"
        )
        self._run(
            "pg_ctl", "-D", str(self.data), "-l", str(self.root / "log"), "-w", "-o", opts, "start"
        )

    def stop(self, mode: str = "fast") -> None:
        """Stop the server (``pg_ctl stop -m mode``; ``immediate`` simulates a crash)."""
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "stop", check=False)

    def pids(self) -> list[int]:
        """The postmaster's pid and its children's (the backends), from ``/proc``."""
        try:
            master = int((self.data / "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return []
        pids = [master]
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == master:
                pids.append(int(stat.parent.name))
        return pids

    def pause(self) -> None:
        """SIGSTOP every process of the cluster: it hangs (accepts TCP, answers nothing)
        instead of refusing — the failure a stopped VM or a stuck storage gives."""
        for pid in self.pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT every process of the cluster (after :meth:`pause`)."""
        for pid in self.pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)

    def destroy(self) -> None:
        """Stop and delete the cluster."""
        self.resume()
        self.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)


def private_cluster(*, migrate: bool = True) -> Iterator[PgCluster]:
    """A started private :class:`PgCluster` (migrated to the core's head when
    ``migrate``), destroyed afterwards: the body of a module-scoped pytest fixture
    (``yield from private_cluster()``). Skips (or fails under ``CI=true``) like
    :func:`require_pg` when PostgreSQL is not available."""
    import asyncio

    import pytest

    require_pg()
    if pg_bin_dir() is None:
        pytest.skip("PostgreSQL server binaries not installed")
    cluster = PgCluster().init()
    cluster.start()
    try:
        if migrate:
            from servehall.db.engine import create_db_engine
            from servehall.db.migrate import upgrade_database

            async def _migrate() -> None:
                engine = create_db_engine(cluster.url)
                try:
                    await upgrade_database(engine)
                finally:
                    await engine.dispose()

            asyncio.run(_migrate())
        yield cluster
    finally:
        cluster.destroy()
