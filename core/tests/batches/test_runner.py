"""The batch runner in process: a real app (no auth plugin, no model served) over
httpx's ASGI transport and a migrated SQLite database. Batches are created through
``/v1/batches``; the runner's passes send every line through the app's own request path
(each a 404 ``model_not_found`` here: the error file), write the result files and end
the batch; it claims nothing while a model's queue has a waiting request; a 429 gives
the line back and pauses the runner; ``stream: true`` lines never run."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
from sqlalchemy import event
from starlette.applications import Starlette
from starlette.types import Receive, Scope, Send

from servehall.api.app import create_app
from servehall.batches.call import SCOPE_KEY, BatchCall
from servehall.batches.runner import BatchRunner
from servehall.plugin.host import Host
from servehall.server.bootstrap import load_deployment


def _host(tmp_path: Path) -> Host:
    config = tmp_path / "c.toml"
    config.write_text(
        f'[database]\nurl = "sqlite+aiosqlite:///{tmp_path / "db.sqlite"}"\n'
        "auto_migrate = true\n"
        f'[files]\ndir = "{tmp_path / "files"}"\n'
        "[batches]\nmax_concurrent_lines = 3\nlease_s = 30\n"
    )
    settings, plugins = load_deployment(config)
    return Host(settings=settings, plugins=plugins)


@pytest.fixture
async def app(tmp_path: Path) -> AsyncIterator[Starlette]:
    app = create_app(_host(tmp_path))
    yield app
    await app.state.api.files.close()


def _jsonl(bodies: dict[str, dict[str, Any]]) -> bytes:
    return "".join(
        json.dumps({"custom_id": k, "method": "POST", "url": "/v1/chat/completions", "body": v})
        + "\n"
        for k, v in bodies.items()
    ).encode()


async def _create(app: Starlette, bodies: dict[str, dict[str, Any]]) -> str:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
        r = await c.post(
            "/v1/files",
            files={"file": ("in.jsonl", _jsonl(bodies))},
            data={"purpose": "batch"},
        )
        assert r.status_code == 200, r.text
        r = await c.post(
            "/v1/batches",
            json={
                "input_file_id": r.json()["id"],
                "endpoint": "/v1/chat/completions",
                "completion_window": "24h",
            },
        )
        assert r.status_code == 200, r.text
        return str(r.json()["id"])


async def _get(app: Starlette, path: str) -> httpx.Response:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
        return await c.get(path)


async def _drain(runner: BatchRunner, app: Starlette, batch_id: str) -> dict[str, Any]:
    for _ in range(200):
        await runner.tick()
        await asyncio.sleep(0.02)
        batch: dict[str, Any] = (await _get(app, f"/v1/batches/{batch_id}")).json()
        if batch["status"] in ("completed", "cancelled", "expired"):
            return batch
    raise AssertionError("the batch did not end")


def _msg(text: str, **extra: Any) -> dict[str, Any]:
    return {"model": "demo", "messages": [{"role": "user", "content": text}], **extra}


async def test_lines_run_through_the_app_and_end_in_files(app: Starlette) -> None:
    bodies = {f"l{i}": _msg(f"hi {i}") for i in range(7)}
    bodies["s"] = _msg("hi", stream=True)
    batch_id = await _create(app, bodies)
    host: Host = app.state.api.host
    runner = BatchRunner(app, host, app.state.api.files, app.state.api.metrics)
    batch = await _drain(runner, app, batch_id)
    assert batch["status"] == "completed"
    assert batch["request_counts"] == {"total": 8, "completed": 0, "failed": 8}
    assert batch["output_file_id"] is None and batch["error_file_id"]
    content = await _get(app, f"/v1/files/{batch['error_file_id']}/content")
    lines = [json.loads(x) for x in content.text.splitlines()]
    assert [x["custom_id"] for x in lines] == list(bodies)  # input order, each once
    for x in lines[:-1]:
        assert x["response"]["status_code"] == 404
        assert x["error"]["code"] == "model_not_found"
        assert x["response"]["request_id"].startswith("chatcmpl-")
    assert lines[-1]["response"] is None and lines[-1]["error"]["code"] == "invalid_request"
    meta = (await _get(app, f"/v1/files/{batch['error_file_id']}")).json()
    assert meta["purpose"] == "batch_output"
    text = (await _get(app, "/metrics")).text
    assert 'servehall_batch_lines_finished_total{outcome="failed"} 8.0' in text


async def test_no_claim_while_online_requests_wait(app: Starlette) -> None:
    batch_id = await _create(app, {"a": _msg("hi")})
    host: Host = app.state.api.host
    runner = BatchRunner(app, host, app.state.api.files)
    busy = SimpleNamespace(scheduler=SimpleNamespace(waiting=1))
    host.models["busy"] = busy  # type: ignore[assignment]
    try:
        assert runner.online_waiting()
        for _ in range(3):
            await runner.tick()
        got = (await _get(app, f"/v1/batches/{batch_id}")).json()
        assert got["status"] == "in_progress" and got["request_counts"]["failed"] == 0
    finally:
        del host.models["busy"]
    assert (await _drain(runner, app, batch_id))["status"] == "completed"


async def test_a_429_gives_the_line_back_and_pauses(app: Starlette) -> None:
    batch_id = await _create(app, {"a": _msg("hi")})
    host: Host = app.state.api.host
    seen: list[BatchCall] = []

    async def limited(scope: Scope, receive: Receive, send: Send) -> None:
        seen.append(scope[SCOPE_KEY])
        await send(
            {"type": "http.response.start", "status": 429, "headers": [(b"retry-after", b"30")]}
        )
        await send({"type": "http.response.body", "body": b"{}"})

    runner = BatchRunner(limited, host, app.state.api.files)
    for _ in range(4):
        await runner.tick()
        await asyncio.sleep(0.02)
    assert len(seen) == 1  # paused for Retry-After after the first 429
    call = seen[0]
    assert call.batch_id == batch_id and call.custom_id == "a"
    assert call.priority == host.settings.batches.priority
    got = (await _get(app, f"/v1/batches/{batch_id}")).json()
    assert got["status"] == "in_progress" and got["request_counts"]["failed"] == 0
    fresh = BatchRunner(app, host, app.state.api.files)  # the line is pending again
    assert (await _drain(fresh, app, batch_id))["request_counts"]["failed"] == 1


async def test_soak_bad_creates_are_4xx(app: Starlette) -> None:
    from servehall.bench.soak.corpus import hostile_shapes

    shapes = [s for s in hostile_shapes("demo") if s.path == "/v1/batches"]
    assert len(shapes) >= 5
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
        for s in shapes:
            r = await c.post(s.path, content=s.content(), headers={"content-type": s.content_type})
            assert r.status_code in (400, 404), (s.name, r.status_code, r.text)
            assert set(r.json()["error"]) == {"message", "type", "param", "code"}
        assert (await c.get("/v1/batches")).json()["data"] == []


async def test_no_database_file_is_created_while_idle(app: Starlette, tmp_path: Path) -> None:
    host: Host = app.state.api.host
    runner = BatchRunner(app, host, app.state.api.files)
    for _ in range(3):
        await runner.tick()
    assert not (tmp_path / "db.sqlite").exists()  # a server without batches needs none


async def test_stop_lets_lines_finish_then_gives_the_rest_back(app: Starlette) -> None:
    batch_id = await _create(app, {"quick": _msg("hi"), "slow": _msg("hi")})
    host: Host = app.state.api.host

    async def answer(scope: Scope, receive: Receive, send: Send) -> None:
        if scope[SCOPE_KEY].custom_id == "slow":
            await asyncio.sleep(60)
        else:
            await asyncio.sleep(0.2)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    runner = BatchRunner(answer, host, app.state.api.files)
    runner.start()
    for _ in range(100):
        if len(runner._inflight) == 2:
            break
        await asyncio.sleep(0.02)
    await runner.stop(grace_s=1.0)
    got = (await _get(app, f"/v1/batches/{batch_id}")).json()
    assert got["request_counts"] == {"total": 2, "completed": 1, "failed": 0}
    assert not runner._inflight
    fresh = BatchRunner(app, host, app.state.api.files)  # "slow" is pending again
    assert (await _drain(fresh, app, batch_id))["request_counts"]["failed"] == 1


async def test_a_tenant_cap_leaves_room_for_another_tenant(app: Starlette) -> None:
    """Tenant a's batch is older and has more lines than the replica's three slots; with
    ``max_lines_per_tenant = 1`` tenant b's batch runs beside it from the start, and
    neither tenant ever has two lines in flight. Without the cap (the control) the
    oldest-first claim gives a every slot first."""
    from dataclasses import replace

    from sqlalchemy import text

    from servehall.admission.principal import ANONYMOUS
    from servehall.batches.principals import principal_to_json

    def owner(tenant: str) -> Any:
        return replace(ANONYMOUS, id=f"key-{tenant}", tenant=tenant)

    a = await _create(app, {f"a{i}": _msg("hi") for i in range(4)})
    b = await _create(app, {f"b{i}": _msg("hi") for i in range(2)})
    host: Host = app.state.api.host
    catalog = await app.state.api.files.catalog()
    async with catalog.engine.begin() as conn:  # the owners, as auth would have stored them
        for batch_id, tenant in ((a, "a"), (b, "b")):
            await conn.execute(
                text("UPDATE batch SET principal = :p WHERE id = :id"),
                {"p": json.dumps(principal_to_json(owner(tenant))), "id": batch_id},
            )

    async def run(cap: int | None) -> list[dict[str, int]]:
        live: dict[str, int] = {}
        seen: list[dict[str, int]] = []

        async def answer(scope: Scope, receive: Receive, send: Send) -> None:
            tenant = scope[SCOPE_KEY].principal.tenant
            live[tenant] = live.get(tenant, 0) + 1
            seen.append(dict(live))
            await asyncio.sleep(0.15)
            live[tenant] -= 1
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"{}"})

        runner = BatchRunner(answer, host, app.state.api.files)
        runner.settings = runner.settings.model_copy(update={"max_lines_per_tenant": cap})
        for _ in range(3):
            await runner.tick()
            await asyncio.sleep(0.05)
        await runner.stop()
        return seen

    first = await run(None)  # the control: a's lines take all three slots
    assert first[:3] == [{"a": 1}, {"a": 2}, {"a": 3}], first
    async with catalog.engine.begin() as conn:  # run it all again, now capped
        await conn.execute(text("UPDATE batch_line SET status = 'pending'"))
    capped = await run(1)
    assert max(s.get("a", 0) for s in capped) == 1 and max(s.get("b", 0) for s in capped) == 1
    assert {"a": 1, "b": 1} in capped, capped  # both tenants at once


async def test_a_line_that_ends_wakes_the_runner(app: Starlette) -> None:
    """With a 5 s poll, six lines on three slots finish in well under two polls: each
    line that ends wakes the loop, which claims the next one at once."""
    batch_id = await _create(app, {f"l{i}": _msg("hi") for i in range(6)})
    host: Host = app.state.api.host
    done = 0

    async def answer(scope: Scope, receive: Receive, send: Send) -> None:
        nonlocal done
        await asyncio.sleep(0.1)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})
        done += 1

    runner = BatchRunner(answer, host, app.state.api.files)
    runner.settings = runner.settings.model_copy(update={"poll_s": 5.0})
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    runner.start()
    try:
        while done < 6:
            assert loop.time() - t0 < 4.5, done  # the second claim did not wait the poll
            await asyncio.sleep(0.02)
    finally:
        await runner.stop()
    got = (await _get(app, f"/v1/batches/{batch_id}")).json()
    assert got["request_counts"]["completed"] == 6


async def test_lines_are_claimed_ahead_and_sent_within_the_slots(app: Starlette) -> None:
    """With 2 slots the first pass claims 4 lines (2 sent, 2 waiting for a slot, so a
    slot's next line needs no database round trip when its line ends); never more than 2
    are sent at once, and every line completes once."""
    batch_id = await _create(app, {f"l{i}": _msg("hi") for i in range(7)})
    host: Host = app.state.api.host
    sending = peak = done = 0

    async def answer(scope: Scope, receive: Receive, send: Send) -> None:
        nonlocal sending, peak, done
        sending += 1
        peak = max(peak, sending)
        await asyncio.sleep(0.1)
        sending -= 1
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})
        done += 1

    runner = BatchRunner(answer, host, app.state.api.files)
    runner.settings = runner.settings.model_copy(update={"poll_s": 5.0, "max_concurrent_lines": 2})
    await runner.tick()
    assert len(runner._inflight) == 4
    await asyncio.sleep(0.03)
    assert sending == 2 and runner._sending == 2
    runner.start()
    try:
        for _ in range(300):
            if done == 7:
                break
            await asyncio.sleep(0.02)
    finally:
        await runner.stop()
    assert done == 7 and peak == 2
    got = (await _get(app, f"/v1/batches/{batch_id}")).json()
    assert got["request_counts"]["completed"] == 7


async def test_a_line_end_wake_only_claims(app: Starlette) -> None:
    """Between two polls, a wake because a line ended runs only the claim: the batch-wide
    upkeep (here: moving ``validating`` batches on, expiring lines) runs on the first
    pass alone, not once per line."""
    await _create(app, {f"l{i}": _msg("hi") for i in range(6)})
    host: Host = app.state.api.host
    done = 0
    statements: list[str] = []

    async def answer(scope: Scope, receive: Receive, send: Send) -> None:
        nonlocal done
        await asyncio.sleep(0.05)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})
        done += 1

    def seen(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        statements.append(" ".join(statement.split()))

    engine = (await app.state.api.files.catalog()).engine.sync_engine
    event.listen(engine, "before_cursor_execute", seen)
    runner = BatchRunner(answer, host, app.state.api.files)
    runner.settings = runner.settings.model_copy(update={"poll_s": 5.0})
    runner.start()
    try:
        for _ in range(200):
            if done == 6:
                break
            await asyncio.sleep(0.02)
    finally:
        await runner.stop()
        event.remove(engine, "before_cursor_execute", seen)
    assert done == 6
    upkeep = [s for s in statements if s.startswith("UPDATE batch SET status")]
    expire = [
        s
        for s in statements
        if s.startswith("UPDATE batch_line SET status") and "batch.expires_at <=" in s
    ]
    assert len(upkeep) == 1, upkeep
    assert len(expire) <= 1, expire


async def test_online_demand_preempts_running_lines_and_holds_claims(app: Starlette) -> None:
    """Two long lines run; an online request asks for a slot: both are stopped at once
    (their calls marked preempted, the metric counts 2) and given back; nothing is
    claimed while the online request is in flight nor for ``online_quiet_s`` after it;
    then both run again and complete."""
    batch_id = await _create(app, {"a": _msg("hi"), "b": _msg("hi")})
    host: Host = app.state.api.host
    seen: list[BatchCall] = []
    hold = True

    async def answer(scope: Scope, receive: Receive, send: Send) -> None:
        seen.append(scope[SCOPE_KEY])
        while hold:
            await asyncio.sleep(0.01)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    runner = BatchRunner(answer, host, app.state.api.files, app.state.api.metrics)
    runner.settings = runner.settings.model_copy(update={"poll_s": 0.05, "online_quiet_s": 0.3})
    runner.start()
    try:
        for _ in range(200):
            if len(runner._calls) == 2:
                break
            await asyncio.sleep(0.01)
        assert len(runner._calls) == 2
        host.online.begin()
        assert all(c.preempted for c in seen)
        await asyncio.sleep(0.3)  # several polls: nothing is claimed meanwhile
        assert not runner._inflight and len(seen) == 2
        got = (await _get(app, f"/v1/batches/{batch_id}")).json()
        assert got["request_counts"]["completed"] == 0
        hold = False
        loop = asyncio.get_running_loop()
        host.online.end()
        ended = loop.time()
        while len(seen) < 4:
            assert loop.time() - ended < 5
            await asyncio.sleep(0.01)
        assert loop.time() - ended >= 0.3  # the quiet time was kept
        assert not any(c.preempted for c in seen[2:])
        batch = await _drain(runner, app, batch_id)
    finally:
        await runner.stop()
    assert batch["request_counts"] == {"total": 2, "completed": 2, "failed": 0}
    text = (await _get(app, "/metrics")).text
    assert "servehall_batch_lines_preempted_total 2.0" in text


async def test_without_preempt_running_lines_finish_beside_online_traffic(app: Starlette) -> None:
    """The control: ``preempt = false`` leaves a running line alone."""
    batch_id = await _create(app, {"a": _msg("hi")})
    host: Host = app.state.api.host
    seen: list[BatchCall] = []

    async def answer(scope: Scope, receive: Receive, send: Send) -> None:
        seen.append(scope[SCOPE_KEY])
        await asyncio.sleep(0.3)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    runner = BatchRunner(answer, host, app.state.api.files)
    runner.settings = runner.settings.model_copy(update={"preempt": False, "poll_s": 0.05})
    runner.start()
    try:
        for _ in range(200):
            if runner._calls:
                break
            await asyncio.sleep(0.01)
        host.online.begin()
        batch = await _drain(runner, app, batch_id)
        host.online.end()
    finally:
        await runner.stop()
    assert len(seen) == 1 and not seen[0].preempted
    assert batch["request_counts"]["completed"] == 1
