"""The guard's rollback as a config revision (:class:`servehall.rollout.live.LiveConfig`,
:mod:`servehall.rollout.sticky`), in process on a real, migrated database (SQLite and
PostgreSQL): stored and audited with the figures in the hash chain, followed by this
replica, kept by a later unrelated apply and by a restart from the same file, ended by
an explicit weight. The versions' engines are not needed (weights only change)."""

from __future__ import annotations

import asyncio
import json
import tomllib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, cast

import pytest
import sqlalchemy as sa

from servehall.config.settings import load_settings
from servehall.db import create_db_engine
from servehall.plugin.host import Host, ServedModel
from servehall.plugin.manager import PluginHost
from servehall.plugin.outcomes import Breach
from servehall.records.chain import verify_chain
from servehall.rollout import revisions
from servehall.rollout.guard import roll_back
from servehall.rollout.live import LiveConfig

FIGURES = {"requests": 10, "errors": 5, "error_rate": 0.5, "window_s": 60.0, "min_requests": 10}
BREACH = Breach("error_rate", "error rate 0.500 > 0.1 over 10 requests", dict(FIGURES))


def config_text(path: Path, weights: dict[str, float], poll_s: float = 0.2) -> str:
    out = f"[server]\nconfig_revisions = true\nconfig_poll_s = {poll_s}\n"
    for version, weight in weights.items():
        out += (
            f'\n[[models]]\nname = "m"\nversion = "{version}"\nweight = {weight:g}\n'
            f'path = "{path}"\nbackend = "null"\n'
        )
        if version == "c":
            out += "rollback_if = { error_rate_above = 0.1, min_requests = 10 }\n"
    return out


def host_of(text: str) -> Host:
    """A host running the ``[[models]]`` of ``text`` (no engines: weights only change)."""
    settings = load_settings(data=tomllib.loads(text))
    host = Host(settings=settings, plugins=PluginHost([]), replica="r1")
    for mc in settings.models:
        served = ServedModel(
            name=mc.name,
            backend=mc.backend,
            engine=cast(Any, None),
            scheduler=cast(Any, None),
            tokenizer=None,
            max_model_len=64,
            version=mc.version,
            weight=mc.weight,
            rollback_if=mc.rollback_if,
            config=mc,
        )
        host.models[served.key] = served
    return host


async def started(text: str, url: str) -> LiveConfig:
    live = LiveConfig(host_of(text), cast(Any, None), text, "toml", None)
    await live.open_revisions(create_db_engine(url))
    return live


async def wait_until(pred: Any, what: str, timeout: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not pred():
        assert asyncio.get_running_loop().time() < deadline, what
        await asyncio.sleep(0.02)


@pytest.fixture
async def db(migrated: str) -> AsyncIterator[str]:
    yield migrated


async def _events(url: str) -> list[tuple[str, str, dict[str, Any]]]:
    engine = create_db_engine(url)
    try:
        async with engine.connect() as conn:
            rows = await conn.execute(
                sa.text("SELECT action, target, details FROM audit_event ORDER BY id")
            )
            return [(a, t, json.loads(d) if isinstance(d, str) else dict(d)) for a, t, d in rows]
    finally:
        await engine.dispose()


async def test_rollback_is_a_revision_that_applies_and_survives(db: str, tmp_path: Path) -> None:
    file = config_text(tmp_path, {"v1": 90, "c": 10})
    live = await started(file, db)
    try:
        assert live.revision == 1
        canary = live.host.models["m@c"]
        roll_back(live.host, None, canary, BREACH)
        assert canary.weight == 0  # at once, before anything is stored
        await wait_until(lambda: live.revision == 2, "the rollback stored and followed")
        assert live.db is not None
        rev = await revisions.latest(live.db)
        assert rev is not None and rev.revision == 2 and rev.applied_by == "guard:r1"
        stored = tomllib.loads(rev.text)["models"][1]
        assert stored["weight"] == 0
        assert stored["rolled_back"]["weight"] == 10
        assert stored["rolled_back"]["reason"] == "error_rate"
        assert "rolled_back" in live.text and live.hash == rev.hash
        assert live.host.settings.models[1].rolled_back is not None
        # audited with the reason and the figures, in the chain, with the revision
        action, target, details = (await _events(db))[-1]
        assert (action, target) == ("model.canary_rollback", "m@c")
        assert details["revision"] == 2 and details["reason"] == "error_rate"
        assert {k: details[k] for k in FIGURES} == FIGURES
        assert details["replica"] == "r1"
        # the operator applies an unrelated change: the canary stays at 0
        result = await live.apply_text(
            config_text(tmp_path, {"v1": 80, "c": 10}), "toml", "api:ops"
        )
        assert result.kept == ["m@c"] and result.revision == 3
        assert canary.weight == 0 and live.host.models["m@v1"].weight == 80
    finally:
        await live.close()

    # a restart from the very same file: the rollback holds, nothing new is stored when
    # the file is what the rollback was made from
    live = await started(file, db)
    try:
        assert live.host.models["m@c"].weight == 0
        assert live.host.models["m@v1"].weight == 90  # the file's, as before
        assert live.revision == 4  # the file differs from revision 3 (v1 at 80)
        assert live.db is not None
        newest = await revisions.latest(live.db)
        assert newest is not None and "rolled_back" in newest.text
        # an explicit weight ends it
        result = await live.apply_text(config_text(tmp_path, {"v1": 90, "c": 5}), "toml", "ops")
        assert result.kept == [] and live.host.models["m@c"].weight == 5
        assert "rolled_back" not in live.text
        assert (await verify_chain(live.db)).ok
    finally:
        await live.close()


async def test_a_restart_adopts_the_rollback_revision(db: str, tmp_path: Path) -> None:
    file = config_text(tmp_path, {"v1": 90, "c": 10})
    live = await started(file, db)
    try:
        roll_back(live.host, None, live.host.models["m@c"], BREACH)
        await wait_until(lambda: live.revision == 2, "the rollback stored and followed")
        # another replica judging the same canary does not store it twice
        again = await started(file, db)
        try:
            assert again.revision == 2, "a restart from the same file adopts the rollback"
            assert again.host.models["m@c"].weight == 0
            again.host.models["m@c"].weight = 0.0
            await again._store_rollback(again.host.models["m@c"], BREACH)
            assert again.db is not None
            assert await revisions.latest_number(again.db) == 2
        finally:
            await again.close()
    finally:
        await live.close()


async def test_without_revisions_the_running_config_keeps_it(tmp_path: Path) -> None:
    file = config_text(tmp_path, {"v1": 90, "c": 10})
    live = LiveConfig(host_of(file), cast(Any, None), file, "toml", None)
    events: list[Any] = []

    class Bus:
        def audit(self, event: Any) -> None:
            events.append(event)

    live.host.records = Bus()
    roll_back(live.host, None, live.host.models["m@c"], BREACH)
    await wait_until(lambda: "rolled_back" in live.text, "the running config marked")
    assert [(e.action, e.target) for e in events] == [("model.canary_rollback", "m@c")]
    assert events[0].details["errors"] == 5
    result = await live.apply_text(config_text(tmp_path, {"v1": 70, "c": 10}), "toml", "sighup")
    assert result.kept == ["m@c"] and live.host.models["m@c"].weight == 0
