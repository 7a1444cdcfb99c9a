"""``/v1/files`` against a real ``servehall serve`` (Hypercorn, HTTP/2, the demo model)
with the auth plugin and a SQLite records database: the official ``openai`` client
uploads, lists, retrieves, reads and deletes a batch input file; bad uploads (a
malformed line, a duplicate ``custom_id``, an unknown ``url``, an empty file, an
unsupported purpose, a file over ``[files] max_bytes`` declared or streamed) are 400/413
envelopes; another principal's file id is a 404 on every route; uploads and deletes are
audit events. Keys are made with the real CLI (``servehall keys create``).
"""

from __future__ import annotations

import json
import sqlite3
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.conftest import KeyedServer, create_keys, keyed_demo_config

PEPPER = "files-pepper-" + uuid.uuid4().hex
PEPPER_ENV = "SERVEHALL_E2E_FILES_PEPPER"
MAX_BYTES = 64 * 1024


def batch_line(custom_id: str, url: str = "/v1/chat/completions", **over: Any) -> str:
    obj: dict[str, Any] = {
        "custom_id": custom_id,
        "method": "POST",
        "url": url,
        "body": {"model": "demo", "messages": [{"role": "user", "content": "Hi"}]},
    }
    obj.update(over)
    return json.dumps(obj) + "\n"


GOOD = (batch_line("a") + batch_line("b", url="/v1/completions")).encode()


Files = KeyedServer
"""The running server, its database file and the keys of three principals."""


@pytest.fixture(scope="module")
def files(
    servehall_server: Any, demo_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Files]:
    work = tmp_path_factory.mktemp("files")
    config, cli, db = keyed_demo_config(
        work,
        demo_model_dir,
        PEPPER_ENV,
        PEPPER,
        files={"dir": str(work / "store"), "max_bytes": MAX_BYTES},
    )
    keys = create_keys(cli, alice=(), bob=(), admin_only=("admin",))
    with servehall_server(config.read_text(), env={PEPPER_ENV: PEPPER}, name="files") as server:
        yield Files(server, db, keys, config)


def upload(c: httpx.Client, data: bytes, purpose: str = "batch", **kw: Any) -> httpx.Response:
    return c.post(
        "/v1/files",
        files={"file": ("input.jsonl", data, "application/jsonl")},
        data={"purpose": purpose},
        **kw,
    )


def envelope(r: httpx.Response, status: int) -> dict[str, Any]:
    assert r.status_code == status, (r.status_code, r.text)
    assert "Traceback" not in r.text
    err: dict[str, Any] = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    return err


def test_openai_client_round_trip(files: Files, tmp_path: Path) -> None:
    client = files.openai("alice")
    path = tmp_path / "requests.jsonl"
    path.write_bytes(GOOD)
    with path.open("rb") as f:
        made = client.files.create(file=f, purpose="batch")
    assert made.id.startswith("file-") and made.object == "file"
    assert made.bytes == len(GOOD) and made.filename == "requests.jsonl"
    assert made.purpose == "batch" and made.status == "processed"
    assert abs(made.created_at - time.time()) < 120
    assert client.files.retrieve(made.id) == made
    listed = client.files.list()
    assert made.id in [f.id for f in listed.data]
    assert made.id in [f.id for f in client.files.list(purpose="batch")]
    assert client.files.content(made.id).read() == GOOD
    gone = client.files.delete(made.id)
    assert gone.id == made.id and gone.deleted is True and gone.object == "file"
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve(made.id)
    with pytest.raises(openai.NotFoundError):
        client.files.delete(made.id)


def test_list_pages(files: Files) -> None:
    with files.http("alice") as c:
        ids = [upload(c, GOOD).json()["id"] for _ in range(3)]
        page = c.get("/v1/files", params={"limit": 2, "order": "asc", "after": ids[0]}).json()
        assert page["object"] == "list" and [f["id"] for f in page["data"]] == ids[1:]
        assert page["first_id"] == ids[1] and page["last_id"] == ids[2]
        assert page["has_more"] is False
        newest = c.get("/v1/files", params={"limit": 1}).json()
        assert [f["id"] for f in newest["data"]] == [ids[2]] and newest["has_more"] is True
        for params, param in (
            ({"limit": "0"}, "limit"),
            ({"limit": "x"}, "limit"),
            ({"order": "up"}, "order"),
            ({"after": "file-nope"}, "after"),
        ):
            assert envelope(c.get("/v1/files", params=params), 400)["param"] == param


@pytest.mark.parametrize(
    ("data", "needle"),
    [
        (batch_line("a") + "{oops\n", "Line 2: not valid JSON"),
        (batch_line("a") + batch_line("b") + batch_line("a"), "Line 3: 'custom_id' 'a'"),
        (batch_line("a", url="/v1/moderations"), "Line 1: 'url' must be one of"),
        (batch_line("a", method="GET"), "Line 1: 'method'"),
        (batch_line("a", body=[1]), "Line 1: 'body'"),
        ("", "empty"),
    ],
)
def test_bad_batch_files_name_the_line(files: Files, data: str, needle: str) -> None:
    with files.http("alice") as c:
        err = envelope(upload(c, data.encode()), 400)
    assert err["code"] == "invalid_batch_file" and err["param"] == "file"
    assert needle in err["message"], err["message"]


def test_bad_uploads(files: Files) -> None:
    with files.http("alice") as c:
        err = envelope(upload(c, GOOD, purpose="assistants"), 400)
        assert err["param"] == "purpose" and err["code"] == "unsupported_purpose"
        no_file = c.post("/v1/files", files={"purpose": (None, "batch")})
        assert envelope(no_file, 400)["param"] == "file"
        envelope(c.post("/v1/files", data={"purpose": "batch"}), 415)  # not multipart
        err = envelope(c.post("/v1/files", files={"file": ("a.jsonl", GOOD)}), 400)
        assert err["param"] == "purpose"
        envelope(c.post("/v1/files", json={"purpose": "batch"}), 415)
        big = (batch_line("x" * 100) * (MAX_BYTES // 100)).encode()
        assert len(big) > MAX_BYTES
        err = envelope(upload(c, big), 413)
        assert err["code"] == "payload_too_large"
        # streamed (no Content-Length): refused once past the limit
        boundary = "b" + uuid.uuid4().hex

        def chunks() -> Iterator[bytes]:
            yield (
                f'--{boundary}\r\nContent-Disposition: form-data; name="purpose"\r\n\r\n'
                f'batch\r\n--{boundary}\r\nContent-Disposition: form-data; name="file"; '
                'filename="big.jsonl"\r\n\r\n'
            ).encode()
            for _ in range(8 * MAX_BYTES // 4096):
                yield b"x" * 4096
            yield f"\r\n--{boundary}--\r\n".encode()

        r = c.post(
            "/v1/files",
            content=chunks(),
            headers={"content-type": f"multipart/form-data; boundary={boundary}"},
        )
        assert envelope(r, 413)["code"] == "payload_too_large"
        assert c.get("/v1/models").status_code == 200  # the connection still serves


def test_files_are_private(files: Files) -> None:
    with files.http("alice") as alice, files.http("bob") as bob:
        made = upload(alice, GOOD).json()
        fid = made["id"]
        for r in (
            bob.get(f"/v1/files/{fid}"),
            bob.get(f"/v1/files/{fid}/content"),
            bob.delete(f"/v1/files/{fid}"),
        ):
            err = envelope(r, 404)
            assert err["code"] == "file_not_found"
        assert fid not in [f["id"] for f in bob.get("/v1/files").json()["data"]]
        assert envelope(bob.get("/v1/files", params={"after": fid}), 400)["param"] == "after"
        assert alice.get(f"/v1/files/{fid}").json() == made  # still there
        envelope(alice.get("/v1/files/file-unknown"), 404)
    with files.http("admin_only") as c:
        assert envelope(c.get("/v1/files"), 403)["code"] == "insufficient_scope"
        assert envelope(upload(c, GOOD), 403)["code"] == "insufficient_scope"


def test_uploads_and_deletes_are_audited(files: Files) -> None:
    with files.http("alice") as c:
        fid = upload(c, GOOD).json()["id"]
        assert c.delete(f"/v1/files/{fid}").status_code == 200
    deadline = time.monotonic() + 15
    while True:
        with sqlite3.connect(files.db) as db:
            rows = db.execute(
                "SELECT action, actor, details FROM audit_event WHERE target = ? ORDER BY id",
                (fid,),
            ).fetchall()
        if len(rows) == 2 or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert [r[0] for r in rows] == ["file.uploaded", "file.deleted"]
    assert rows[0][1] == rows[1][1] and rows[0][1].startswith("sh-")
    assert json.loads(rows[0][2])["bytes"] == len(GOOD)
