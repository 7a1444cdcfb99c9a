"""Tests of servehall.sources.push: every file is uploaded, the manifest last, through a
directory-backed store (real files; the S3 round trip is in ``test_push_pull.py``)."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest

from servehall.config.models import ModelStoreSettings
from servehall.sources.errors import SourceError
from servehall.sources.manifest import MANIFEST_NAME, Manifest
from servehall.sources.push import push
from servehall.sources.store import Progress


class DirStore:
    """A store whose objects are files under one directory; records the upload order."""

    def __init__(self, root: Path, fail_on: str | None = None) -> None:
        self.url = f"dir://{root}"
        self.root = root
        self.order: list[str] = []
        self.fail_on = fail_on

    def read(self, name: str) -> bytes:
        return (self.root / name).read_bytes()

    def download(self, name: str, dest: Path, progress: Progress) -> str:
        shutil.copyfile(self.root / name, dest)
        return hashlib.sha256(dest.read_bytes()).hexdigest()

    def upload(self, src: Path, name: str) -> None:
        if name == self.fail_on:
            raise SourceError(f"{self.url}/{name}: refused")
        dest = self.root / name
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, dest)
        self.order.append(name)


def _model(root: Path) -> Path:
    root.mkdir()
    (root / "config.json").write_text('{"a": 1}')
    (root / "weights").mkdir()
    (root / "weights" / "model.bin").write_bytes(b"\x00\x01" * 5000)
    return root


def _settings(tmp_path: Path) -> ModelStoreSettings:
    return ModelStoreSettings(cache_dir=tmp_path / "cache")


def test_push_uploads_every_file_then_the_manifest(tmp_path: Path) -> None:
    model = _model(tmp_path / "model")
    store = DirStore(tmp_path / "store")
    manifest = push(model, store.url, _settings(tmp_path), store)
    assert store.order[-1] == MANIFEST_NAME
    assert sorted(store.order[:-1]) == ["config.json", "weights/model.bin"]
    assert store.read("weights/model.bin") == (model / "weights" / "model.bin").read_bytes()
    uploaded = Manifest.parse(store.read(MANIFEST_NAME), "test")
    assert uploaded == manifest and manifest.total_bytes == 8 + 10000
    assert uploaded.raw == manifest.raw


def test_a_failed_upload_leaves_no_manifest(tmp_path: Path) -> None:
    model = _model(tmp_path / "model")
    store = DirStore(tmp_path / "store", fail_on="weights/model.bin")
    with pytest.raises(SourceError, match="refused"):
        push(model, store.url, _settings(tmp_path), store)
    assert not (store.root / MANIFEST_NAME).exists()


def test_an_empty_or_missing_directory_is_refused(tmp_path: Path) -> None:
    store = DirStore(tmp_path / "store")
    (tmp_path / "empty").mkdir()
    for d in (tmp_path / "empty", tmp_path / "missing"):
        with pytest.raises(SourceError):
            push(d, store.url, _settings(tmp_path), store)
    assert store.order == []


def test_the_url_picks_the_store(tmp_path: Path) -> None:
    model = _model(tmp_path / "model")
    with pytest.raises(SourceError, match="unknown scheme"):
        push(model, "ftp://host/m", _settings(tmp_path))
    with pytest.raises(SourceError, match="read-only; push to an s3:// URL"):
        push(model, "https://mirror.invalid/m", _settings(tmp_path))
