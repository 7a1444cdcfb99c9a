"""Signed checkpoints of the audit chain: tamper evidence that survives database writes.

The chain in ``audit_event`` (:mod:`servehall.records.chain`) is an unkeyed SHA-256
chain: whoever can write the table can rewrite a row and recompute every hash after it.
A checkpoint signs the chain head — ``last_id``, ``events``, ``last_hash`` and the time
— with an Ed25519 key that is *not* in the database (the ``[audit] signing_key``
reference), the way AWS CloudTrail signs its digest files. A chain rewritten and rehashed
after a checkpoint no longer ends, at the checkpoint's ``last_id``, in the signed hash;
``servehall audit verify`` with the public key then names the first failing checkpoint
and the id range the rewrite lies in.

The signed message is the ASCII text
``servehall-audit-checkpoint/1\\n{last_id}\\n{events}\\n{last_hash}\\n{at}`` with ``at``
as ``YYYY-MM-DDTHH:MM:SS.ffffffZ``. ``key_id`` is the SHA-256 hex of the raw 32-byte
public key. What a checkpoint cannot show: events appended after the last checkpoint
(they are reported as unsigned), and checkpoints deleted from the end.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import Table, func, insert, select
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from servehall.db.models import AuditChainHead, AuditCheckpoint, AuditEventRow
from servehall.errors import ConfigError
from servehall.records.codec import iso_utc

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import (
        Ed25519PrivateKey,
        Ed25519PublicKey,
    )

_C: Table = AuditCheckpoint.__table__  # type: ignore[assignment]
_H: Table = AuditChainHead.__table__  # type: ignore[assignment]
_T: Table = AuditEventRow.__table__  # type: ignore[assignment]

DOMAIN = "servehall-audit-checkpoint/1"
"""First line of every signed message (so a signature cannot be reused elsewhere)."""


def message(last_id: int, events: int, last_hash: str, at: datetime) -> bytes:
    """The bytes a checkpoint signs (see module docstring)."""
    return f"{DOMAIN}\n{last_id}\n{events}\n{last_hash}\n{iso_utc(at)}".encode("ascii")


def key_id(public: Ed25519PublicKey) -> str:
    """SHA-256 hex of the raw 32-byte public key."""
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

    return hashlib.sha256(public.public_bytes(Encoding.Raw, PublicFormat.Raw)).hexdigest()


def load_private_key(pem: str) -> Ed25519PrivateKey:
    """An Ed25519 private key from PEM text (PKCS#8, unencrypted).

    Raises:
        ConfigError: not a PEM private key, or not Ed25519.
    """
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from cryptography.hazmat.primitives.serialization import load_pem_private_key

    try:
        key = load_pem_private_key(pem.encode(), password=None)
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"audit.signing_key: not a PEM private key ({exc})") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise ConfigError(f"audit.signing_key: an Ed25519 key is needed, not {type(key).__name__}")
    return key


def load_public_key(path: Path) -> Ed25519PublicKey:
    """An Ed25519 public key from a PEM file.

    Raises:
        ConfigError: unreadable file, not a PEM public key, or not Ed25519.
    """
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
    from cryptography.hazmat.primitives.serialization import load_pem_public_key

    try:
        key = load_pem_public_key(Path(path).expanduser().read_bytes())
    except OSError as exc:
        raise ConfigError(f"audit public key {path}: {exc.strerror}") from None
    except ValueError as exc:
        raise ConfigError(f"audit public key {path}: not a PEM public key ({exc})") from None
    if not isinstance(key, Ed25519PublicKey):
        raise ConfigError(f"audit public key {path}: an Ed25519 key is needed")
    return key


def generate_keypair() -> tuple[bytes, bytes]:
    """A new Ed25519 key pair as (private PKCS#8 PEM, public SubjectPublicKeyInfo PEM)."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from cryptography.hazmat.primitives.serialization import (
        Encoding,
        NoEncryption,
        PrivateFormat,
        PublicFormat,
    )

    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption())
    public = key.public_key().public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo)
    return private, public


class CheckpointSigner:
    """Signs the chain head into ``audit_checkpoint`` (one per replica's ``sql`` sink).

    Args:
        key: the Ed25519 private key.
        interval_s: :meth:`due` turns True this long after the last checkpoint.
    """

    def __init__(self, key: Ed25519PrivateKey, interval_s: float) -> None:
        self.key = key
        self.key_id = key_id(key.public_key())
        self.interval_s = interval_s
        self._last_at: float | None = None  # never signed: the first batch is due
        self._last_signed: tuple[int, int] | None = None

    def due(self, now: float) -> bool:
        """True before the first :meth:`sign`, then when ``interval_s`` passed since the
        last one (monotonic ``now``: its zero is the machine's boot, so "never" cannot be
        a last sign at 0 — on a machine up for less than ``interval_s`` nothing would be
        due)."""
        return self._last_at is None or now - self._last_at >= self.interval_s

    async def sign(self, conn: AsyncConnection, now: float) -> bool:
        """Insert a checkpoint of the current head on ``conn`` (caller's transaction).

        Nothing is written when the head did not move since this signer's last
        checkpoint, or when the chain is empty. Returns True when a row was written.
        """
        self._last_at = now
        head = (
            await conn.execute(
                select(_H.c.last_id, _H.c.events, _H.c.last_hash).where(_H.c.id == 1)
            )
        ).one_or_none()
        if head is None or int(head.events) == 0:
            return False
        state = (int(head.last_id), int(head.events))
        if state == self._last_signed:
            return False
        at = datetime.now(UTC)
        sig = self.key.sign(message(state[0], state[1], str(head.last_hash), at))
        await conn.execute(
            insert(_C).values(
                at=at,
                last_id=state[0],
                events=state[1],
                last_hash=str(head.last_hash),
                key_id=self.key_id,
                signature=sig.hex(),
            )
        )
        self._last_signed = state
        return True


@dataclass(frozen=True, slots=True)
class CheckpointResult:
    """Outcome of :func:`verify_checkpoints`.

    ``ok`` False: ``bad_checkpoint`` is the first failing checkpoint's id and ``reason``
    says what is wrong (naming the audit_event ids involved). ``unsigned`` counts the
    chain's events after the last good checkpoint (not covered by any signature).
    """

    ok: bool
    checked: int
    unsigned: int = 0
    bad_checkpoint: int | None = None
    reason: str = ""


async def verify_checkpoints(engine: AsyncEngine, public: Ed25519PublicKey) -> CheckpointResult:
    """Check every ``audit_checkpoint`` row against ``public`` and the chain.

    For each checkpoint in id order: its ``key_id`` is the public key's, its signature
    verifies, and ``audit_event`` still holds, at id ``last_id``, a row whose hash is
    ``last_hash``, with exactly ``events`` rows up to it. Run after
    :func:`~servehall.records.chain.verify_chain` (which checks the links between rows):
    together they show a chain rewritten and rehashed before the last checkpoint.
    """
    from cryptography.exceptions import InvalidSignature

    kid = key_id(public)
    checked = 0
    prev_id = 0
    prev_cid: int | None = None
    async with engine.connect() as conn:
        cps = (await conn.execute(select(_C).order_by(_C.c.id))).all()
        total = int((await conn.execute(select(func.count()).select_from(_T))).scalar_one())
        if not cps:
            return CheckpointResult(
                False, 0, total, None, "no signed checkpoint in audit_checkpoint"
            )
        for cp in cps:
            cid = int(cp.id)
            if cp.key_id != kid:
                return CheckpointResult(
                    False,
                    checked,
                    total,
                    cid,
                    f"signed by key {cp.key_id[:16]}…, not by the given public key ({kid[:16]}…)",
                )
            try:
                public.verify(
                    bytes.fromhex(cp.signature),
                    message(int(cp.last_id), int(cp.events), cp.last_hash, cp.at),
                )
            except (InvalidSignature, ValueError):
                return CheckpointResult(
                    False,
                    checked,
                    total,
                    cid,
                    "signature does not verify (the checkpoint row was edited or forged)",
                )
            row = (
                await conn.execute(select(_T.c.hash).where(_T.c.id == int(cp.last_id)))
            ).one_or_none()
            upto = int(
                (
                    await conn.execute(
                        select(func.count()).select_from(_T).where(_T.c.id <= int(cp.last_id))
                    )
                ).scalar_one()
            )
            span = f"audit_event ids {prev_id + 1}..{int(cp.last_id)}"
            if row is None or row.hash != cp.last_hash or upto != int(cp.events):
                what = (
                    f"audit_event id {int(cp.last_id)} is missing"
                    if row is None
                    else f"audit_event id {int(cp.last_id)} has hash {row.hash[:16]}…, "
                    f"signed {cp.last_hash[:16]}…"
                    if row.hash != cp.last_hash
                    else f"{upto} event(s) up to id {int(cp.last_id)}, signed {int(cp.events)}"
                )
                return CheckpointResult(
                    False,
                    checked,
                    total,
                    cid,
                    f"the chain no longer matches the signed head: {what} "
                    f"(rows rewritten, inserted or deleted in {span}"
                    + (f"; checkpoint {prev_cid} before it still matches)" if prev_cid else ")"),
                )
            prev_id = max(prev_id, int(cp.last_id))
            prev_cid = cid
            checked += 1
        after = int(
            (
                await conn.execute(select(func.count()).select_from(_T).where(_T.c.id > prev_id))
            ).scalar_one()
        )
    return CheckpointResult(True, checked, after)
