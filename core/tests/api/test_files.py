"""``/v1/files`` in process (Starlette app over httpx's ASGI transport, no auth plugin:
the anonymous principal owns the files): a round trip, the soak's bad-upload shapes
(every one a 4xx before anything is stored), and a database that is not migrated (503
``files_unavailable``, never a 500)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from servehall.api.app import create_app
from servehall.bench.soak.corpus import hostile_shapes
from servehall.plugin.host import Host
from servehall.server.bootstrap import load_deployment

LINE = {"custom_id": "a", "method": "POST", "url": "/v1/completions", "body": {"prompt": "x"}}


def _host(tmp_path: Path, auto_migrate: bool = True) -> Host:
    config = tmp_path / "c.toml"
    config.write_text(
        f'[database]\nurl = "sqlite+aiosqlite:///{tmp_path / "db.sqlite"}"\n'
        f"auto_migrate = {str(auto_migrate).lower()}\n"
        f'[files]\ndir = "{tmp_path / "files"}"\nmax_bytes = 4096\n'
    )
    settings, plugins = load_deployment(config)
    return Host(settings=settings, plugins=plugins)


@pytest.fixture
async def client(tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(_host(tmp_path))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
        yield c
    await app.state.api.files.close()


def _upload(data: bytes, purpose: str = "batch") -> dict[str, Any]:
    return {"files": {"file": ("in.jsonl", data)}, "data": {"purpose": purpose}}


async def test_anonymous_round_trip(client: httpx.AsyncClient, tmp_path: Path) -> None:
    data = (json.dumps(LINE) + "\n").encode()
    r = await client.post("/v1/files", **_upload(data))
    assert r.status_code == 200, r.text
    made = r.json()
    assert made["bytes"] == len(data) and made["filename"] == "in.jsonl"
    assert (tmp_path / "files" / made["id"]).read_bytes() == data
    assert (await client.get(f"/v1/files/{made['id']}")).json() == made
    assert (await client.get(f"/v1/files/{made['id']}/content")).content == data
    listed = (await client.get("/v1/files")).json()
    assert [f["id"] for f in listed["data"]] == [made["id"]]
    r = await client.delete(f"/v1/files/{made['id']}")
    assert r.json() == {"id": made["id"], "object": "file", "deleted": True}
    assert not (tmp_path / "files" / made["id"]).exists()
    r = await client.get(f"/v1/files/{made['id']}/content")
    assert r.status_code == 404 and r.json()["error"]["code"] == "file_not_found"


async def test_lost_content_is_a_404(client: httpx.AsyncClient, tmp_path: Path) -> None:
    made = (await client.post("/v1/files", **_upload(json.dumps(LINE).encode()))).json()
    (tmp_path / "files" / made["id"]).unlink()
    r = await client.get(f"/v1/files/{made['id']}/content")
    assert r.status_code == 404 and r.json()["error"]["code"] == "file_content_missing"


async def test_oversize_and_filename(client: httpx.AsyncClient) -> None:
    big = (json.dumps(LINE) + "\n").encode() * 100
    r = await client.post("/v1/files", **_upload(big))
    assert r.status_code == 413 and r.json()["error"]["code"] == "payload_too_large"
    r = await client.post(
        "/v1/files",
        files={"file": ("../../etc/pw.jsonl", json.dumps(LINE).encode())},
        data={"purpose": "batch"},
    )
    assert r.json()["filename"] == "pw.jsonl"


async def test_soak_bad_uploads_are_4xx(client: httpx.AsyncClient, tmp_path: Path) -> None:
    shapes = [s for s in hostile_shapes("demo") if s.path == "/v1/files"]
    assert len(shapes) >= 6
    for s in shapes:
        r = await client.post(s.path, content=s.content(), headers={"content-type": s.content_type})
        assert r.status_code in (400, 415), (s.name, r.status_code, r.text)
        assert set(r.json()["error"]) == {"message", "type", "param", "code"}
    assert not (tmp_path / "files").exists()  # nothing was stored


async def test_unmigrated_database_is_a_503(tmp_path: Path) -> None:
    app = create_app(_host(tmp_path, auto_migrate=False))
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
        r = await c.get("/v1/files")
        assert r.status_code == 503, r.text
        err = r.json()["error"]
        assert err["code"] == "files_unavailable" and "not migrated" in err["message"]
        r = await c.post("/v1/files", **_upload(json.dumps(LINE).encode()))
        assert r.status_code == 503
    await app.state.api.files.close()


@pytest.mark.parametrize(
    ("path", "methods"),
    [
        ("/v1/files", {"GET", "HEAD", "POST"}),
        ("/v1/files/file-x", {"GET", "HEAD", "DELETE"}),
        ("/v1/batches", {"GET", "HEAD", "POST"}),
        ("/admin/config", {"GET", "HEAD", "POST"}),
    ],
)
async def test_a_405_allows_every_method_of_the_path(
    client: httpx.AsyncClient, path: str, methods: set[str]
) -> None:
    """Found by schemathesis: with one route per method, a 405's ``Allow`` named only
    the methods of the first route of the path."""
    r = await client.request("PUT", path)
    assert r.status_code == 405, r.text
    assert {m.strip() for m in r.headers["allow"].split(",")} == methods
    assert r.json()["error"]["code"] == "method_not_allowed"


async def test_head_of_a_list_route(client: httpx.AsyncClient) -> None:
    r = await client.head("/v1/files")
    assert r.status_code == 200 and r.content == b""
    assert (await client.get("/v1/files")).json()["object"] == "list"
