"""Tests of servehall.sources.https: the read-only HTTP(S) mirror store, against a real
local HTTP server (``http.server`` on a thread) serving files and chosen error statuses."""

from __future__ import annotations

import hashlib
import http.server
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar
from urllib.parse import unquote

import pytest

from servehall.config.models import ModelStoreSettings
from servehall.sources.errors import SourceError, StoreUnavailableError
from servehall.sources.https import HttpStore
from servehall.testing.sockets import free_port

BIG = bytes(range(256)) * 8192  # 2 MiB: more than one download chunk


class Handler(http.server.BaseHTTPRequestHandler):
    """Serves ``/m/<name>`` from :data:`FILES`; ``/status/<code>/...`` answers that code;
    ``/cut/<name>`` announces more bytes than it sends; ``/moved/...`` redirects to /m/."""

    files: ClassVar[dict[str, bytes]] = {}
    seen: ClassVar[list[str]] = []

    def do_GET(self) -> None:
        self.seen.append(self.path)
        parts = self.path.split("/")
        if parts[1] == "status":
            self.send_response(int(parts[2]))
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if parts[1] == "moved":
            self.send_response(302)
            self.send_header("Location", "/m/" + "/".join(parts[2:]))
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        body = self.files.get(unquote("/".join(parts[2:])))
        if body is None:
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        self.send_response(200)
        if parts[1] == "cut":
            self.send_header("Content-Length", str(len(body) * 2))
            self.end_headers()
            self.wfile.write(body)
            self.close_connection = True
            return
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    Handler.files = {
        "config.json": b'{"a": 1}',
        "weights/model.safetensors": BIG,
        "name with space.txt": b"spaced",
    }
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


def _store(url: str) -> HttpStore:
    return HttpStore(url, ModelStoreSettings(cache_dir=Path("/nonexistent"), timeout_s=5))


def test_read_and_trailing_slash(server: str) -> None:
    assert _store(f"{server}/m/").read("config.json") == b'{"a": 1}'
    assert _store(f"{server}/m").url == f"{server}/m"


def test_names_are_quoted(server: str) -> None:
    Handler.seen.clear()
    assert _store(f"{server}/m").read("name with space.txt") == b"spaced"
    assert Handler.seen == ["/m/name%20with%20space.txt"]


def test_redirects_are_followed(server: str) -> None:
    assert _store(f"{server}/moved").read("config.json") == b'{"a": 1}'


def test_download_writes_the_file_and_returns_its_digest(server: str, tmp_path: Path) -> None:
    dest = tmp_path / "model.safetensors"
    chunks: list[int] = []
    digest = _store(f"{server}/m").download("weights/model.safetensors", dest, chunks.append)
    assert dest.read_bytes() == BIG
    assert digest == hashlib.sha256(BIG).hexdigest()
    assert sum(chunks) == len(BIG) and len(chunks) >= 2


@pytest.mark.parametrize(
    ("code", "error", "message"),
    [
        (404, SourceError, "no such file"),
        (403, SourceError, r"refused access \(403\)"),
        (401, SourceError, r"refused access \(401\)"),
        (410, SourceError, "the mirror answered 410"),
        (500, StoreUnavailableError, "the mirror answered 500"),
        (503, StoreUnavailableError, "the mirror answered 503"),
    ],
)
def test_status_codes(server: str, code: int, error: type[Exception], message: str) -> None:
    store = _store(f"{server}/status/{code}")
    with pytest.raises(error, match=message) as err:
        store.read("x.bin")
    assert str(err.value).startswith(f"{server}/status/{code}/x.bin: ")
    if error is SourceError:
        assert not isinstance(err.value, StoreUnavailableError)  # not worth a retry


def test_missing_file_on_download(server: str, tmp_path: Path) -> None:
    with pytest.raises(SourceError, match="no such file"):
        _store(f"{server}/m").download("absent.bin", tmp_path / "a", lambda n: None)


def test_unreachable_mirror_is_unavailable(tmp_path: Path) -> None:
    port = free_port()  # nothing listens there
    with pytest.raises(StoreUnavailableError, match="the mirror is unreachable"):
        _store(f"http://127.0.0.1:{port}/m").read("config.json")


def test_download_broken_off_is_unavailable(server: str, tmp_path: Path) -> None:
    with pytest.raises(StoreUnavailableError, match="download broke off"):
        _store(f"{server}/cut").download("config.json", tmp_path / "c", lambda n: None)


def test_upload_is_refused(server: str, tmp_path: Path) -> None:
    with pytest.raises(SourceError, match="read-only; push to an s3:// URL"):
        _store(f"{server}/m").upload(tmp_path, "x")
