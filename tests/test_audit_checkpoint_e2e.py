"""Signed audit checkpoints end to end: a real server signs the chain head into a real
SQLite file with a key given by file reference; ``servehall audit keygen`` made the
keys and ``servehall audit verify`` checks them. Someone with write access to the file
rewrites a row with plain SQL and recomputes the chain: the unkeyed chain check passes,
the checkpoint check fails naming the checkpoint and the rows; a plain edit fails the
chain check naming the row."""

from __future__ import annotations

import json
import sqlite3
import subprocess
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from servehall.records.chain import canonical, chain_hash
from tests.conftest import _serve_cmd, dump_toml, run_cli


def _rewrite_and_rehash(db: Path, row_id: int) -> None:
    """Edit row ``row_id``'s target and recompute every hash after it, and the head."""
    con = sqlite3.connect(db)
    rows = con.execute(
        "SELECT id, at, actor, action, target, details, prev_hash FROM audit_event ORDER BY id"
    ).fetchall()
    prev: str | None = None
    for rid, at, actor, action, target, details, prev_hash in rows:
        if rid < row_id:
            continue
        prev = prev_hash if prev is None else prev
        target = "forged" if rid == row_id else target
        when = datetime.fromisoformat(at).replace(tzinfo=UTC)
        h = chain_hash(prev, canonical(when, actor, action, target, json.loads(details)))
        con.execute(
            "UPDATE audit_event SET target = ?, prev_hash = ?, hash = ? WHERE id = ?",
            (target, prev, h, rid),
        )
        prev = h
    con.execute("UPDATE audit_chain_head SET last_hash = ?", (prev,))
    con.commit()
    con.close()


def test_rewritten_chain_fails_signed_verification(
    tmp_path: Path,
    servehall_server: Callable[..., Any],
    demo_model_dir: Path,
    demo_config_factory: Callable[..., dict[str, Any]],
) -> None:
    key = tmp_path / "audit.key"
    db = tmp_path / "records.db"
    cfg = demo_config_factory(
        demo_model_dir,
        database={"url": f"sqlite+aiosqlite:///{db}", "auto_migrate": True},
        sinks=[{"name": "sql", "options": {"linger_s": 0.01}}],
        audit={"signing_key": {"file": str(key)}, "checkpoint_interval_s": 0.2},
    )
    # the engine is not under test: the built-in null engine starts in no time
    cfg["models"][0] |= {
        "backend": "null",
        "options": {},
        "isolation": "thread",
        "tool_call_grammar": "strict",  # the null engine compiles no grammar
    }
    cfg["plugins"] = {"enabled": []}
    cfg_path = tmp_path / "servehall.toml"
    cfg_path.write_text(dump_toml(cfg))
    gen = subprocess.run(
        [*_serve_cmd(), "audit", "keygen", str(key)], capture_output=True, text=True, timeout=60
    )
    assert gen.returncode == 0, gen.stderr
    assert "BEGIN PUBLIC KEY" in gen.stdout and key.stat().st_mode & 0o077 == 0
    pub = tmp_path / "audit.key.pub"

    with servehall_server(cfg, name="audit-signed") as srv:
        pass  # start (config.loaded, plugins.loaded …) and a clean stop (last checkpoint)
    assert srv.process.returncode == 0, srv.log_text()[-3000:]
    assert "PRIVATE KEY" not in db.read_bytes().decode(errors="replace")

    ok = run_cli(cfg_path, "audit", "verify", "--public-key", str(pub))
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "chain intact" in ok.stdout and "0 event(s) after the last checkpoint" in ok.stdout
    con = sqlite3.connect(db)
    n = con.execute("SELECT count(*) FROM audit_event").fetchone()[0]
    cps = con.execute("SELECT id, last_id FROM audit_checkpoint ORDER BY id").fetchall()
    con.close()
    assert n >= 2 and cps and cps[-1][1] == n, (n, cps)
    first_cp = next(cid for cid, last_id in cps if last_id >= 1)

    _rewrite_and_rehash(db, 1)
    unkeyed = run_cli(cfg_path, "audit", "verify")
    assert unkeyed.returncode == 0 and "not checked" in unkeyed.stdout, unkeyed.stdout
    bad = run_cli(cfg_path, "audit", "verify", "--public-key", str(pub))
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert bad.stdout.startswith(f"FAILED: audit_checkpoint id {first_cp}:"), bad.stdout
    assert "audit_event ids 1.." in bad.stdout

    con = sqlite3.connect(db)
    con.execute("UPDATE audit_event SET actor = 'mallory' WHERE id = 2")
    con.commit()
    con.close()
    edited = run_cli(cfg_path, "audit", "verify", "--public-key", str(pub))
    assert edited.returncode == 1
    assert edited.stdout.startswith("FAILED: audit_event id 2:"), edited.stdout
