"""The key store on a PostgreSQL that hangs (a private cluster stopped with SIGSTOP):
with the ``[database]`` timeouts a key lookup fails with ``TimeoutError`` at its deadline
(the authenticator answers 503) and works again after SIGCONT; without them it hangs
(the control). Concurrent lookups of one key share one query (SQLite)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from servehall import DbTimeouts, ServiceUnavailableError
from servehall.db.testing import PgCluster, private_cluster
from servehall_auth.audit import FailureAuditor
from servehall_auth.authn import Authenticator
from servehall_auth.settings import AuthSettings
from servehall_auth.store import KeyStore, api_key, close_store, make_engine, metadata

PEPPER = "unit-test-pepper-0123456789"
TIMEOUTS = DbTimeouts(command_s=2.0, lock_s=2.0, idle_in_transaction_s=5.0)


@pytest.fixture(scope="module")
def cluster() -> Iterator[PgCluster]:
    yield from private_cluster(migrate=False)


async def _store(url: str, timeouts: DbTimeouts | None) -> KeyStore:
    engine = make_engine(url, timeouts)
    async with engine.begin() as conn:
        await conn.run_sync(lambda c: metadata.create_all(c, tables=[api_key]))
    lookup = timeouts.command_s if timeouts is not None else 0.0
    return KeyStore(engine, PEPPER, lookup_timeout_s=lookup)


@pytest.fixture
async def hung(cluster: PgCluster) -> AsyncIterator[PgCluster]:
    """The cluster, to be paused by the test; resumed afterwards whatever happens."""
    try:
        yield cluster
    finally:
        cluster.resume()


async def _timed(coro: object) -> tuple[str, float]:
    t0 = time.monotonic()
    try:
        await coro  # type: ignore[misc]
    except BaseException as exc:
        return type(exc).__name__, time.monotonic() - t0
    return "ok", time.monotonic() - t0


@pytest.mark.postgres
async def test_a_hung_database_fails_lookups_at_the_deadline_and_recovers(
    hung: PgCluster,
) -> None:
    store = await _store(hung.url, TIMEOUTS)
    try:
        rec, key = await store.create(tenant="t")
        assert (await store.verify(rec.key_id, key))[0] == "ok"
        hung.pause()
        # 12 concurrent requests, three rounds: more than the pool holds (4 + 4)
        for _ in range(3):
            got = await asyncio.gather(*(_timed(store.verify(rec.key_id, key)) for _ in range(12)))
            assert {outcome for outcome, _ in got} == {"TimeoutError"}, got
            # the deadline is the lookup's (2 s), not the pool's wait plus the query's (4 s)
            assert max(t for _, t in got) < TIMEOUTS.command_s + 0.8, got
        # the authenticator turns it into 503 auth_unavailable with Retry-After
        auth = Authenticator(
            AuthSettings(pepper=PEPPER), store, None, FailureAuditor(lambda e: None, 5)
        )
        with pytest.raises(ServiceUnavailableError) as err:
            await auth.authenticate([f"Bearer {key}"], [])
        assert err.value.code == "auth_unavailable" and err.value.status == 503
        assert err.value.headers == {"Retry-After": "1"}
        hung.resume()
        deadline = time.monotonic() + 30
        while True:
            outcome, _ = await _timed(store.verify(rec.key_id, key))
            if outcome == "ok" or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.2)
        assert outcome == "ok"
    finally:
        await close_store(store)


@pytest.mark.postgres
async def test_control_without_timeouts_a_lookup_hangs(hung: PgCluster) -> None:
    """The control: the same store without the ``[database]`` timeouts (what the plugin
    did before) waits on the stopped server for as long as we let it."""
    store = await _store(hung.url, None)
    try:
        rec, key = await store.create(tenant="t")
        hung.pause()
        task = asyncio.ensure_future(store.verify(rec.key_id, key))
        done, _ = await asyncio.wait({task}, timeout=3 * TIMEOUTS.command_s)
        assert not done, "the lookup ended although nothing bounds it"
        hung.resume()
        assert (await asyncio.wait_for(task, 30))[0] == "ok"
    finally:
        await close_store(store)


async def test_concurrent_lookups_of_one_key_share_one_query(tmp_path: Path) -> None:
    store = await _store(f"sqlite+aiosqlite:///{tmp_path / 'k.db'}", TIMEOUTS)
    selects: list[str] = []

    @sa.event.listens_for(store.engine.sync_engine, "before_cursor_execute")
    def count(conn: object, cursor: object, statement: str, *args: object) -> None:
        if statement.lstrip().upper().startswith("SELECT") and "api_key" in statement:
            selects.append(statement)

    try:
        rec, key = await store.create(tenant="t")
        got = await asyncio.gather(*(store.verify(rec.key_id, key) for _ in range(10)))
        assert {outcome for outcome, _ in got} == {"ok"}
        assert len(selects) == 1, len(selects)
        await store.revoke(rec.key_id)  # a forget: the next lookup reads again
        selects.clear()
        assert (await store.verify(rec.key_id, key))[0] == "revoked"
        assert len(selects) == 1
        assert not store._lookups  # finished lookups are not kept
    finally:
        await close_store(store)
