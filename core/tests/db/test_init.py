"""Tests of the servehall.db package: its public names, and that importing it (the
tables) does not load SQLAlchemy's async engine until an engine helper is read."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import servehall
import servehall.db as db


def test_public_names_resolve() -> None:
    from servehall.db import engine, locate, models, types

    assert db.DbBase is models.DbBase and db.UTCDateTime is types.UTCDateTime
    assert db.create_db_engine is engine.create_db_engine and db.DbTimeouts is engine.DbTimeouts
    assert db.safe_url is engine.safe_url and db.database_url is engine.database_url
    assert db.describe_database is locate.describe_database
    assert db.require_existing_database is locate.require_existing_database
    assert sorted(db.__all__) == db.__all__
    for name in db.__all__:
        getattr(db, name)


def test_unknown_name() -> None:
    with pytest.raises(AttributeError, match=r"'servehall\.db' has no attribute 'Session'"):
        _ = db.Session  # type: ignore[attr-defined]


def test_tables_import_without_the_async_engine() -> None:
    code = (
        "import json, sys\n"
        "import servehall.db as db\n"
        "before = 'sqlalchemy.ext.asyncio' in sys.modules or 'servehall.db.engine' in sys.modules\n"
        "db.create_db_engine\n"
        "print(json.dumps([before, 'servehall.db.engine' in sys.modules]))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(servehall.__file__).parent.parent)}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == [False, True]
