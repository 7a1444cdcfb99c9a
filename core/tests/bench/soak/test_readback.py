"""Reading the soak's records back (servehall.bench.soak.readback): the spill and
quarantine files left behind, and where the server's database is."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from servehall.bench.soak.invariants import Rejection, check_no_leftovers
from servehall.bench.soak.options import SoakOptions
from servehall.bench.soak.readback import (
    count_rows,
    database_url,
    leftover_files,
    unanswered_note,
)
from servehall.bench.soak.server import Server

PG = "postgresql+asyncpg://u:p@127.0.0.1:5999/db"


def test_leftover_files_reads_spill_and_quarantine_files(tmp_path: Path) -> None:
    (tmp_path / "servehall-spill-sql.jsonl").write_text('{"request_id": "a"}\n{}\n')
    q = [{"request_id": "b", "error": "bad value"}, {"record": {"request_id": "c"}}]
    (tmp_path / "servehall-quarantine-sql.jsonl").write_text(
        "\n".join(json.dumps(x) for x in q) + "\n"
    )
    (tmp_path / "server.log").write_text("x\n")
    files, rejections = leftover_files([tmp_path])
    by_kind = {f.kind: f for f in files}
    assert by_kind["spill"].records == 2
    assert (by_kind["quarantine"].records, by_kind["quarantine"].explained) == (2, 1)
    assert rejections == [Rejection("b", "bad value"), Rejection("c", None)]
    assert not check_no_leftovers(files, rejections).ok


def test_nothing_left_over_in_an_empty_directory(tmp_path: Path) -> None:
    assert leftover_files([tmp_path, tmp_path]) == ([], [])


def test_the_database_url(tmp_path: Path) -> None:
    assert database_url(SoakOptions(db_url=PG), None) == PG
    assert database_url(SoakOptions(url="http://127.0.0.1:1"), None) is None
    cfg = tmp_path / "soak.toml"
    cfg.write_text('[database]\nurl = "sqlite+aiosqlite:///rel.db"\n')
    # a relative SQLite path of a server the soak started is in its work directory
    proc = subprocess.Popen(["true"])
    proc.wait()
    server = Server(proc, "http://127.0.0.1:1", tmp_path, cfg, tmp_path / "server.log")
    assert database_url(SoakOptions(), server) == f"sqlite+aiosqlite:///{tmp_path / 'rel.db'}"
    assert database_url(SoakOptions(config=cfg), None) == "sqlite+aiosqlite:///rel.db"


def test_rows_beyond_the_answered_ones_are_counted(tmp_path: Path) -> None:
    import asyncio
    import sqlite3

    db = tmp_path / "r.db"
    with sqlite3.connect(db) as c:
        c.execute("CREATE TABLE request_log (request_id TEXT)")
        c.executemany("INSERT INTO request_log VALUES (?)", [("a",), ("b",), ("c",)])
    assert asyncio.run(count_rows(f"sqlite+aiosqlite:///{db}")) == 3
    assert unanswered_note(3, 2, 4).startswith("1 row(s) beyond the answered responses' (4 ")
