"""``servehall.api.batches`` on the real app (SQLite file, file store in ``tmp_path``, no
runner): creating a batch from an uploaded file and every refusal naming its field,
owner-only retrieval and listing with cursors, cancellation (once audited; a batch
already cancelling answered as it is), and the ``inference`` scope."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import text

from servehall import Policy, Principal, hookimpl
from servehall.api.app import create_app
from servehall.config.settings import load_settings
from servehall.plugin.host import Host
from servehall.plugin.manager import PluginHost

URL = "/v1/chat/completions"


class Keys:
    """``x-who: <id>`` is principal ``<id>``; ``admin-only`` lacks the inference scope."""

    @hookimpl
    def servehall_authenticate(self, request: Any) -> Principal:
        who = request.headers.get("x-who", "alice")
        if who == "admin-only":
            return Principal(id=who, policy=Policy(scopes=frozenset({"admin"})))
        return Principal(id=who)


class Audit:
    def __init__(self) -> None:
        self.events: list[Any] = []

    def emit(self, record: Any) -> None:
        pass

    def audit(self, event: Any) -> None:
        self.events.append(event)

    def check_admission(self) -> None:
        pass

    def unready_sinks(self) -> dict[str, str]:
        return {}

    async def close(self) -> None:
        pass


@pytest.fixture
async def app(tmp_path: Path) -> AsyncIterator[Any]:
    settings = load_settings(
        data={
            "database": {
                "url": f"sqlite+aiosqlite:///{tmp_path / 'db.sqlite'}",
                "auto_migrate": True,
            },
            "files": {"dir": str(tmp_path / "files")},
            "sinks": [],
        }
    )
    host = Host(settings=settings, plugins=PluginHost([], extra=[("keys", Keys())]))
    host.records = Audit()
    app = create_app(host)
    yield app
    await app.state.api.files.close()


def _client(app: Any, who: str = "alice") -> httpx.AsyncClient:
    return httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://t", headers={"x-who": who}
    )


def _jsonl(*lines: dict[str, Any]) -> bytes:
    return "".join(json.dumps(line) + "\n" for line in lines).encode()


def _line(i: int, url: str = URL) -> dict[str, Any]:
    body = {"model": "m", "messages": [{"role": "user", "content": f"q{i}"}]}
    return {"custom_id": f"c{i}", "method": "POST", "url": url, "body": body}


async def _upload(c: httpx.AsyncClient, data: bytes) -> str:
    r = await c.post("/v1/files", files={"file": ("in.jsonl", data)}, data={"purpose": "batch"})
    assert r.status_code == 200, r.text
    return str(r.json()["id"])


def _create(file_id: str, **kw: Any) -> dict[str, Any]:
    return {"input_file_id": file_id, "endpoint": URL, "completion_window": "24h", **kw}


async def test_create_retrieve_list_cancel(app: Any) -> None:
    async with _client(app) as c:
        file_id = await _upload(c, _jsonl(_line(1), _line(2)) + b"\n")
        r = await c.post("/v1/batches", json=_create(file_id, metadata={"team": "a"}))
        assert r.status_code == 200, r.text
        batch = r.json()
        assert batch["id"].startswith("batch_") and batch["object"] == "batch"
        assert batch["status"] == "validating" and batch["endpoint"] == URL
        assert batch["input_file_id"] == file_id and batch["metadata"] == {"team": "a"}
        assert batch["request_counts"]["total"] == 2
        assert batch["expires_at"] - batch["created_at"] == 24 * 3600
        got = await c.get(f"/v1/batches/{batch['id']}")
        assert got.json() == batch
        second = (await c.post("/v1/batches", json=_create(file_id))).json()
        page = (await c.get("/v1/batches", params={"limit": 1})).json()
        assert [b["id"] for b in page["data"]] == [second["id"]] and page["has_more"]
        rest = (await c.get("/v1/batches", params={"after": second["id"]})).json()
        assert [b["id"] for b in rest["data"]] == [batch["id"]] and not rest["has_more"]
        r = await c.get("/v1/batches", params={"after": "batch_unknown"})
        assert r.status_code == 400 and r.json()["error"]["param"] == "after"
        cancelled = await c.post(f"/v1/batches/{batch['id']}/cancel")
        assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelling"
        again = await c.post(f"/v1/batches/{batch['id']}/cancel")
        assert again.status_code == 200 and again.json()["status"] == "cancelling"
    events = app.state.api.host.records.events
    actions = [(e.action, e.actor, e.target) for e in events if e.action.startswith("batch.")]
    assert actions == [
        ("batch.created", "alice", batch["id"]),
        ("batch.created", "alice", second["id"]),
        ("batch.cancelled", "alice", batch["id"]),
    ]


async def test_a_finished_batch_cannot_be_cancelled(app: Any) -> None:
    async with _client(app) as c:
        file_id = await _upload(c, _jsonl(_line(1)))
        batch = (await c.post("/v1/batches", json=_create(file_id))).json()
        engine = (await app.state.api.files.catalog()).engine
        async with engine.begin() as conn:
            await conn.execute(text("UPDATE batch SET status = 'completed'"))
        r = await c.post(f"/v1/batches/{batch['id']}/cancel")
    assert r.status_code == 409 and r.json()["error"]["code"] == "batch_not_cancellable"


async def test_batches_are_their_owners(app: Any) -> None:
    async with _client(app) as alice:
        file_id = await _upload(alice, _jsonl(_line(1)))
        batch = (await alice.post("/v1/batches", json=_create(file_id))).json()
    async with _client(app, "bob") as bob:
        for r in (
            await bob.get(f"/v1/batches/{batch['id']}"),
            await bob.post(f"/v1/batches/{batch['id']}/cancel"),
            await bob.get("/v1/batches/batch_nope"),
        ):
            assert r.status_code == 404 and r.json()["error"]["code"] == "batch_not_found"
        assert (await bob.get("/v1/batches")).json()["data"] == []
        r = await bob.post("/v1/batches", json=_create(file_id))  # alice's file
        assert r.status_code == 404 and r.json()["error"]["code"] == "file_not_found"
    async with _client(app, "admin-only") as admin:
        r = await admin.get("/v1/batches")
        assert r.status_code == 403 and r.json()["error"]["code"] == "insufficient_scope"


@pytest.mark.parametrize(
    ("body", "param", "code"),
    [
        ({"input_file_id": None}, "input_file_id", None),
        ({"endpoint": ""}, "endpoint", None),
        ({"endpoint": "/v1/images"}, "endpoint", "unsupported_endpoint"),
        ({"completion_window": "1h"}, "completion_window", None),
        ({"metadata": {"k": 1}}, "metadata", None),
        ({"metadata": {f"k{i}": "v" for i in range(17)}}, "metadata", None),
        ({"metadata": {"k" * 65: "v"}}, "metadata", None),
        ({"metadata": ["x"]}, "metadata", None),
    ],
)
async def test_create_refusals_name_the_field(
    app: Any, body: dict[str, Any], param: str, code: str | None
) -> None:
    async with _client(app) as c:
        file_id = await _upload(c, _jsonl(_line(1)))
        r = await c.post("/v1/batches", json={**_create(file_id), **body})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param
    if code is not None:
        assert err["code"] == code


async def test_input_file_refusals(app: Any, tmp_path: Path) -> None:
    async with _client(app) as c:
        # a server-made file of alice (a batch's output) is not an input file
        output = await app.state.api.files.add_bytes(
            "alice", "out.jsonl", "batch_output", _jsonl(_line(1))
        )
        r = await c.post("/v1/batches", json=_create(output.id))
        assert r.status_code == 400 and "purpose 'batch_output'" in r.json()["error"]["message"]
        assert r.json()["error"]["param"] == "input_file_id"
        mixed = await _upload(c, _jsonl(_line(1), _line(2, url="/v1/completions")))
        r = await c.post("/v1/batches", json=_create(mixed))
        err = r.json()["error"]
        assert r.status_code == 400 and err["code"] == "invalid_batch_file"
        assert err["message"].startswith("Line 2: 'url' '/v1/completions' does not match")
        gone = await _upload(c, _jsonl(_line(1)))
        (tmp_path / "files" / gone).unlink()
        r = await c.post("/v1/batches", json=_create(gone))
        assert r.status_code == 404 and r.json()["error"]["code"] == "file_content_missing"
        r = await c.post("/v1/batches", json=_create("file-nope"))
        assert r.status_code == 404 and r.json()["error"]["code"] == "file_not_found"
    events = app.state.api.host.records.events
    assert [e.action for e in events if e.action.startswith("batch.")] == []
