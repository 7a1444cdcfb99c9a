"""The directory file store (:mod:`servehall.files.store`): whole-file puts, no temp
file left by a failed put, keys that are names and never paths."""

from __future__ import annotations

import hashlib
import io
from pathlib import Path

import pytest

from servehall.files.store import CHUNK, DirectoryStore, FileStore


class _Boom(io.BytesIO):
    def read(self, n: int | None = -1) -> bytes:
        if self.tell() >= CHUNK:
            raise OSError("disk went away")
        return super().read(n)


def test_directory_store_put_open_delete(tmp_path: Path) -> None:
    store: FileStore = DirectoryStore(tmp_path / "files")
    data = b"x" * (CHUNK + 17)
    blob = store.put("file-1", io.BytesIO(data))
    assert blob.size == len(data) and blob.sha256 == hashlib.sha256(data).hexdigest()
    with store.open("file-1") as f:
        assert f.read() == data
    blob = store.put("file-1", io.BytesIO(b"new"))  # replaced whole
    with store.open("file-1") as f:
        assert f.read() == b"new"
    store.delete("file-1")
    store.delete("file-1")  # nothing there: no error
    with pytest.raises(FileNotFoundError):
        store.open("file-1")
    assert list((tmp_path / "files").iterdir()) == []


def test_failed_put_leaves_nothing(tmp_path: Path) -> None:
    store = DirectoryStore(tmp_path)
    store.put("keep", io.BytesIO(b"old"))
    with pytest.raises(OSError):
        store.put("keep", _Boom(b"y" * (CHUNK * 2)))
    assert [p.name for p in tmp_path.iterdir()] == ["keep"]  # no temp file left
    assert (tmp_path / "keep").read_bytes() == b"old"


@pytest.mark.parametrize("key", ["", "../x", "a/b", "a b", ".", "x" * 201])
def test_keys_are_names_not_paths(tmp_path: Path, key: str) -> None:
    store = DirectoryStore(tmp_path)
    with pytest.raises(ValueError):
        store.put(key, io.BytesIO(b"x"))
    with pytest.raises(ValueError):
        store.open(key)
