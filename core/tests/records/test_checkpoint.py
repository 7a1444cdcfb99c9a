"""Signed audit checkpoints (records/checkpoint.py) on a real SQLite file and a real
PostgreSQL database: the sql sink signs the chain head, and a chain rewritten *and
rehashed* by someone with write access to the database — which the unkeyed chain alone
cannot show — fails the checkpoint check, naming the checkpoint and the id range."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

from servehall import AuditEvent, ConfigError
from servehall.config.settings import load_settings
from servehall.db import create_db_engine
from servehall.db.testing import run_sql
from servehall.records.chain import canonical, chain_hash, verify_chain
from servehall.records.checkpoint import (
    CheckpointSigner,
    generate_keypair,
    load_private_key,
    load_public_key,
    verify_checkpoints,
)
from servehall.records.sql_sink import SqlSink, sql_sink_factory


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    d = tmp_path_factory.mktemp("keys")
    private, public = generate_keypair()
    (d / "audit.key").write_bytes(private)
    (d / "audit.pub").write_bytes(public)
    return d / "audit.key", d / "audit.pub"


def _events(n: int, start: int) -> list[AuditEvent]:
    return [
        AuditEvent(action="key.created", actor="admin", target=f"key-{start + i}", details={})
        for i in range(n)
    ]


async def _signed_chain(url: str, key: Path) -> SqlSink:
    """Two batches of 3 events, a checkpoint after each (interval tiny)."""
    signer = CheckpointSigner(load_private_key(key.read_text()), interval_s=1e-9)
    sink = SqlSink(url, signer=signer)
    await sink.start()
    await sink.write(_events(3, 1))
    await sink.write(_events(3, 4))
    return sink


async def _check(url: str, pub: Path) -> tuple[Any, Any]:
    engine = create_db_engine(url)
    try:
        return await verify_chain(engine), await verify_checkpoints(engine, load_public_key(pub))
    finally:
        await engine.dispose()


async def _rewrite_and_rehash(url: str, row_id: int, target: str) -> None:
    """What an attacker with write access does: edit one row, recompute every hash from
    it on and move the head — all with plain SQL."""
    rows = await run_sql(
        url, "SELECT id, at, actor, action, target, details, prev_hash FROM audit_event ORDER BY id"
    )
    engine = create_db_engine(url)
    async with engine.begin() as conn:
        prev = None
        for r in rows:
            if r.id < row_id:
                continue
            prev = r.prev_hash if prev is None else prev
            tgt = target if r.id == row_id else r.target
            details = r.details if isinstance(r.details, dict) else json.loads(r.details)
            at = r.at if isinstance(r.at, datetime) else datetime.fromisoformat(r.at)
            if at.tzinfo is None:
                at = at.replace(tzinfo=UTC)
            h = chain_hash(prev, canonical(at, r.actor, r.action, tgt, details))
            await conn.execute(
                text("UPDATE audit_event SET target = :t, prev_hash = :p, hash = :h WHERE id = :i"),
                {"t": tgt, "p": prev, "h": h, "i": r.id},
            )
            prev = h
        await conn.execute(text("UPDATE audit_chain_head SET last_hash = :h"), {"h": prev})
    await engine.dispose()


async def test_sink_signs_the_head_and_verify_passes(migrated: str, keys: tuple[Path, Path]):
    sink = await _signed_chain(migrated, keys[0])
    assert not await sink.checkpoint()  # the head did not move: no new row
    await sink.close()
    chain, cps = await _check(migrated, keys[1])
    assert chain.ok and chain.checked == 6
    assert cps.ok and cps.checked == 2 and cps.unsigned == 0, cps
    rows = await run_sql(migrated, "SELECT last_id, events FROM audit_checkpoint ORDER BY id")
    assert [tuple(r) for r in rows] == [(3, 3), (6, 6)]


async def test_close_signs_what_arrived_since(migrated: str, keys: tuple[Path, Path]):
    signer = CheckpointSigner(load_private_key(keys[0].read_text()), interval_s=3600)
    sink = SqlSink(migrated, signer=signer)
    await sink.start()
    await sink.write(_events(2, 1))  # first batch: due at once
    await sink.write(_events(2, 3))  # not due for an hour
    _, cps = await _check(migrated, keys[1])
    assert cps.ok and cps.checked == 1 and cps.unsigned == 2
    await sink.close()  # shutdown: a last checkpoint
    _, cps = await _check(migrated, keys[1])
    assert cps.ok and cps.checked == 2 and cps.unsigned == 0


async def test_rewritten_and_rehashed_chain_fails_at_the_checkpoint(
    migrated: str, keys: tuple[Path, Path]
):
    sink = await _signed_chain(migrated, keys[0])
    await sink.close()
    await _rewrite_and_rehash(migrated, 5, "key-forged")
    chain, cps = await _check(migrated, keys[1])
    assert chain.ok, chain  # the unkeyed chain cannot see it
    assert not cps.ok
    ids = [r.id for r in await run_sql(migrated, "SELECT id FROM audit_checkpoint ORDER BY id")]
    assert cps.bad_checkpoint == ids[1] and cps.checked == 1
    assert "audit_event ids 4..6" in cps.reason and f"checkpoint {ids[0]}" in cps.reason, cps


async def test_forged_checkpoint_and_wrong_key_fail(migrated: str, keys: tuple[Path, Path]):
    sink = await _signed_chain(migrated, keys[0])
    await sink.close()
    await _rewrite_and_rehash(migrated, 2, "key-forged")
    # the attacker also moves the checkpoint to the new hash: its signature breaks
    new = (await run_sql(migrated, "SELECT hash FROM audit_event WHERE id = 3"))[0].hash
    ids = [r.id for r in await run_sql(migrated, "SELECT id FROM audit_checkpoint ORDER BY id")]
    engine = create_db_engine(migrated)
    async with engine.begin() as conn:
        await conn.execute(
            text("UPDATE audit_checkpoint SET last_hash = :h WHERE id = :i"),
            {"h": new, "i": ids[0]},
        )
    await engine.dispose()
    _, cps = await _check(migrated, keys[1])
    assert not cps.ok and cps.bad_checkpoint == ids[0]
    assert "signature does not verify" in cps.reason
    other = keys[1].parent / "other.pub"
    other.write_bytes(generate_keypair()[1])
    _, wrong = await _check(migrated, other)
    assert not wrong.ok and wrong.bad_checkpoint == ids[0] and "not by the given" in wrong.reason


async def test_no_checkpoint_is_a_failure(migrated: str, keys: tuple[Path, Path]):
    sink = SqlSink(migrated)
    await sink.start()
    await sink.write(_events(2, 1))
    await sink.close()
    _, cps = await _check(migrated, keys[1])
    assert not cps.ok and cps.unsigned == 2 and "no signed checkpoint" in cps.reason


def test_signing_key_only_as_a_reference(keys: tuple[Path, Path], monkeypatch: Any):
    with pytest.raises(ConfigError, match="never the key itself"):
        load_settings(data={"audit": {"signing_key": keys[0].read_text()}})
    s = load_settings(data={"audit": {"signing_key": {"file": str(keys[0])}}})
    assert s.audit.signing_key is not None
    monkeypatch.setenv("AUDIT_KEY_T", keys[0].read_text())
    s = load_settings(data={"audit": {"signing_key": {"env": "AUDIT_KEY_T"}}})
    sink = sql_sink_factory({}, s)
    assert sink.signer is not None and "PRIVATE" not in repr(s.audit)


def test_a_key_that_is_not_ed25519_is_one_line(tmp_path: Path):
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.hazmat.primitives.serialization import (
        Encoding,
        NoEncryption,
        PrivateFormat,
    )

    pem = ec.generate_private_key(ec.SECP256R1()).private_bytes(
        Encoding.PEM, PrivateFormat.PKCS8, NoEncryption()
    )
    with pytest.raises(ConfigError, match="Ed25519 key is needed"):
        load_private_key(pem.decode())
    with pytest.raises(ConfigError, match="not a PEM private key"):
        load_private_key("hello")


def test_the_first_checkpoint_is_due_however_long_the_machine_has_been_up(
    keys: tuple[Path, Path],
):
    """``due`` reads the monotonic clock, whose zero is the boot: a signer that never
    signed is due even 5 s after boot, with an hour's interval (a CI machine up for less
    than ``interval_s`` signed nothing at the first batch)."""
    signer = CheckpointSigner(load_private_key(keys[0].read_text()), interval_s=3600)
    assert signer.due(5.0)
    signer._last_at = 5.0  # what sign() records
    assert not signer.due(3000.0) and signer.due(3605.0)
