"""After the stop: the server's records read back (``request_log`` and
``record_rejected`` rows, spill and quarantine files left behind, ``servehall audit
verify``) and checked against what the clients observed (I2–I5)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from servehall.bench.soak.clients import Traffic
from servehall.bench.soak.invariants import (
    InvariantResult,
    LeftoverFile,
    Rejection,
    Row,
    check_audit,
    check_no_leftovers,
    check_one_row_each,
    check_rows_match,
)
from servehall.bench.soak.options import SoakOptions
from servehall.bench.soak.server import Server
from servehall.testing.cli import servehall_cmd


def database_url(opts: SoakOptions, server: Server | None) -> str | None:
    """The SQL database the server writes its rows to (None: unknown)."""
    if opts.db_url:
        return opts.db_url
    config = server.config if server is not None else opts.config
    if config is None:
        return None
    from servehall.config.settings import load_settings

    url = load_settings(config).database.url.get_secret_value()
    if url.startswith("sqlite") and ":///" in url and server is not None:
        path = url.split(":///", 1)[1]
        if path and not path.startswith("/"):
            url = url.split(":///", 1)[0] + ":///" + str(server.workdir / path)
    return url


async def read_rows(url: str, ids: Sequence[str]) -> tuple[list[Row], list[Rejection], bool]:
    """The ``request_log`` rows of ``ids`` (every row, duplicates included), the
    rejected records (``record_rejected`` rows, when that table exists) and whether it
    exists."""
    import sqlalchemy as sa
    from sqlalchemy.ext.asyncio import create_async_engine

    engine = create_async_engine(url)
    rows: list[Row] = []
    rejections: list[Rejection] = []
    try:
        async with engine.connect() as conn:
            for i in range(0, len(ids), 500):
                chunk = list(ids[i : i + 500])
                q = sa.text(
                    "SELECT request_id, status_code, prompt_tokens, completion_tokens "
                    "FROM request_log WHERE request_id IN :ids"
                ).bindparams(sa.bindparam("ids", expanding=True))
                for r in (await conn.execute(q, {"ids": chunk})).all():
                    rows.append(Row(str(r[0]), int(r[1]), int(r[2] or 0), int(r[3] or 0)))
            tables = await conn.run_sync(lambda c: sa.inspect(c).get_table_names())
            has_rejected = "record_rejected" in tables
            if has_rejected:
                res = await conn.execute(sa.text("SELECT * FROM record_rejected"))
                for m in res.mappings().all():
                    rid = m.get("request_id")
                    err = m.get("error") or m.get("reason") or m.get("message")
                    rejections.append(Rejection(rid and str(rid), err and str(err)))
    finally:
        await engine.dispose()
    return rows, rejections, has_rejected


async def count_rows(url: str) -> int:
    """How many ``request_log`` rows the database holds (all of them)."""
    import sqlalchemy as sa
    from sqlalchemy.ext.asyncio import create_async_engine

    engine = create_async_engine(url)
    try:
        async with engine.connect() as conn:
            result = await conn.execute(sa.text("SELECT COUNT(*) FROM request_log"))
            return int(result.scalar_one())
    finally:
        await engine.dispose()


def unanswered_note(total: int, answered: int, unanswered: int) -> str:
    """I2's note on the rows no client saw an id of, for a server the soak started (a
    database of its own): requests that reached the server but whose answer never
    reached the client (a connection cut by a fault) are recorded too. ``total``: every
    ``request_log`` row; ``answered``: the rows of the responses' ids; ``unanswered``:
    the requests that got no answer."""
    return (
        f"{total - answered} row(s) beyond the answered responses' "
        f"({unanswered} request(s) got no answer: those that reached the server are "
        "recorded too)"
    )


def leftover_files(dirs: Sequence[Path]) -> tuple[list[LeftoverFile], list[Rejection]]:
    """Spill files (``servehall-spill-*.jsonl``) and quarantine files (``*quarantine*``,
    ``*rejected*``) in ``dirs``, with the rejections the quarantine files hold (a line
    with an ``error``/``reason`` key is explained)."""
    files: list[LeftoverFile] = []
    rejections: list[Rejection] = []
    seen: set[Path] = set()
    for d in dirs:
        for p in sorted(d.glob("*")):
            name = p.name.lower()
            if p in seen or not p.is_file():
                continue
            kind = (
                "spill"
                if name.startswith("servehall-spill")
                else "quarantine"
                if ("quarantine" in name or "rejected" in name)
                else None
            )
            if kind is None:
                continue
            seen.add(p)
            records = explained = 0
            with contextlib.suppress(OSError):
                for line in p.read_text(errors="replace").splitlines():
                    if not line.strip():
                        continue
                    records += 1
                    obj: Any = None
                    with contextlib.suppress(ValueError):
                        obj = json.loads(line)
                    if kind == "quarantine":
                        err = None
                        rid = None
                        if isinstance(obj, dict):
                            err = obj.get("error") or obj.get("reason")
                            rec = obj.get("record")
                            rid = obj.get("request_id") or (
                                rec.get("request_id") if isinstance(rec, dict) else None
                            )
                        explained += bool(err)
                        rejections.append(Rejection(rid and str(rid), err and str(err)))
            files.append(LeftoverFile(str(p), kind, records, explained))
    return files, rejections


def audit_verify(config: Path, workdir: Path | None) -> tuple[int | None, str]:
    """Run ``servehall audit verify --config CONFIG``: (exit code, output)."""
    try:
        proc = subprocess.run(
            [*servehall_cmd(), "audit", "verify", "--config", str(config)],
            capture_output=True,
            text=True,
            cwd=workdir,
            timeout=300,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"{type(exc).__name__}: {exc}"
    return proc.returncode, (proc.stdout + proc.stderr)


async def record_checks(
    opts: SoakOptions, server: Server | None, traffic: Traffic
) -> list[InvariantResult]:
    """I2–I5 (skipped when the database is unknown)."""
    url = database_url(opts, server)
    if url is None:
        skipped = []
        for key, title in (
            ("I2", "rows"),
            ("I3", "row contents"),
            ("I4", "leftovers"),
            ("I5", "audit verify"),
        ):
            r = InvariantResult(key, title)
            r.skipped = "the database is unknown (give --config or --db-url)"
            skipped.append(r)
        return skipped
    if server is None:
        await asyncio.sleep(5.0)  # let a running server's sinks flush
    ids = [o.request_id for o in traffic.observations if o.request_id]
    rows, rejections, _ = await read_rows(url, ids)
    dirs = [server.workdir] if server is not None else [Path.cwd()]
    files, file_rejections = leftover_files(dirs)
    rejections += file_rejections
    rejected_ids = {r.request_id for r in rejections if r.request_id and r.error}
    by_id = {r.request_id: r for r in rows}
    one_each = check_one_row_each(traffic.observations, [r.request_id for r in rows], rejected_ids)
    if server is not None:
        unanswered = sum(1 for o in traffic.observations if o.status == 0 and not o.disconnected)
        one_each.notes.append(unanswered_note(await count_rows(url), len(by_id), unanswered))
    results = [
        one_each,
        check_rows_match(traffic.observations, by_id),
        check_no_leftovers(files, rejections),
    ]
    config = server.config if server is not None else opts.config
    if config is None:
        r = InvariantResult("I5", "servehall audit verify passes")
        r.skipped = "no config to verify with (give --config)"
        results.append(r)
    else:
        code, output = await asyncio.to_thread(
            audit_verify, config, server.workdir if server else None
        )
        results.append(check_audit(code, output))
    return results
