"""The key store on real SQLite and PostgreSQL: create, verify, list, revoke, rotate."""

from __future__ import annotations

from datetime import timedelta

import pytest
import sqlalchemy as sa

from servehall import Limits
from servehall_auth.keys import hash_key, parse_key
from servehall_auth.store import KeyNotFoundError, KeyStore, api_key, utcnow


async def verify(store: KeyStore, key: str) -> str:
    parsed = parse_key(key)
    assert parsed is not None
    outcome, _ = await store.verify(parsed.key_id, key)
    return outcome


async def test_create_stores_only_the_hash(keystore: KeyStore) -> None:
    rec, key = await keystore.create(
        tenant="team-a", name="ci", scopes=["inference"], models=["demo"], rpm=5, tpm=500
    )
    assert key.startswith(rec.public_id + "-")
    async with keystore.engine.connect() as conn:
        rows = (await conn.execute(sa.select(api_key))).mappings().all()
    assert len(rows) == 1
    dumped = repr(dict(rows[0]))
    assert key not in dumped and key.split("-", 2)[2] not in dumped
    assert rows[0]["secret_hash"] == hash_key(key, "unit-test-pepper-0123456789")
    p = rec.principal()
    assert p.id == rec.public_id and p.tenant == "team-a"
    assert p.policy.models == frozenset({"demo"}) and p.policy.limits == Limits(rpm=5, tpm=500)


async def test_verify_outcomes(keystore: KeyStore) -> None:
    rec, key = await keystore.create(tenant="t")
    assert await verify(keystore, key) == "ok"
    wrong = key[:-1] + ("A" if key[-1] != "A" else "B")
    assert await verify(keystore, wrong) == "bad_secret"
    assert await verify(keystore, "sh-aaaaaaaaaa-" + "A" * 43) == "unknown_key"
    await keystore.revoke(rec.key_id)
    assert await verify(keystore, key) == "revoked"
    _, key2 = await keystore.create(tenant="t", expires_at=utcnow() - timedelta(seconds=1))
    assert await verify(keystore, key2) == "expired"


async def test_list_and_revoke(keystore: KeyStore) -> None:
    a, _ = await keystore.create(tenant="a")
    b, _ = await keystore.create(tenant="b")
    assert {r.key_id for r in await keystore.list()} == {a.key_id, b.key_id}
    assert [r.key_id for r in await keystore.list(tenant="a")] == [a.key_id]
    first = await keystore.revoke(a.key_id)
    again = await keystore.revoke(a.key_id)
    assert first.revoked_at == again.revoked_at
    assert [r.key_id for r in await keystore.list()] == [b.key_id]
    assert len(await keystore.list(include_revoked=True)) == 2
    with pytest.raises(KeyNotFoundError):
        await keystore.revoke("zzzzzzzzzz")


async def test_rotate_with_overlap(keystore: KeyStore) -> None:
    rec, old = await keystore.create(tenant="t", scopes=["inference", "admin"], rpm=3)
    rec2, new = await keystore.rotate(rec.key_id, timedelta(hours=1))
    assert new != old and rec2.key_id == rec.key_id
    assert (rec2.scopes, rec2.rpm, rec2.tenant) == (rec.scopes, rec.rpm, rec.tenant)
    assert await verify(keystore, new) == "ok"
    assert await verify(keystore, old) == "ok_previous"
    # after the window the old secret is dead
    later = utcnow() + timedelta(hours=2)
    parsed = parse_key(old)
    assert parsed is not None
    assert (await keystore.verify(parsed.key_id, old, now=later))[0] == "bad_secret"
    # a rotation without overlap kills the previous secret at once
    _, newest = await keystore.rotate(rec.key_id)
    assert await verify(keystore, new) == "bad_secret"
    assert await verify(keystore, old) == "bad_secret"
    assert await verify(keystore, newest) == "ok"
    await keystore.revoke(rec.key_id)
    with pytest.raises(ValueError):
        await keystore.rotate(rec.key_id)


async def test_cache_is_dropped_on_changes(db_url: str, keystore: KeyStore) -> None:
    cached = KeyStore(keystore.engine, "unit-test-pepper-0123456789", cache_ttl_s=60)
    rec, key = await cached.create(tenant="t")
    assert await verify(cached, key) == "ok"
    await cached.revoke(rec.key_id)
    assert await verify(cached, key) == "revoked"


async def test_times_are_utc(keystore: KeyStore) -> None:
    rec, _ = await keystore.create(tenant="t", expires_at=utcnow() + timedelta(days=1))
    got = await keystore.get(rec.key_id)
    assert got.created_at.tzinfo is not None and got.expires_at is not None
    assert abs((got.expires_at - rec.expires_at).total_seconds()) < 1  # type: ignore[operator]
