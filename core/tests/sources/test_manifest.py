"""``servehall.sources.manifest``: a model's manifest built from its directory, read back
(every malformed field one line naming the origin), and a directory checked against it."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from servehall.sources.errors import SourceError
from servehall.sources.manifest import (
    MANIFEST_NAME,
    FileEntry,
    Manifest,
    build_manifest,
    is_safe_path,
    sha256_file,
    verify_dir,
)

_SHA = "a" * 64


def _model(tmp_path: Path) -> Path:
    d = tmp_path / "model"
    (d / "sub").mkdir(parents=True)
    (d / "config.json").write_text('{"a": 1}')
    (d / "sub" / "weights.bin").write_bytes(b"\x00" * 10)
    (d / ".git").mkdir()
    (d / ".git" / "HEAD").write_text("ref")
    (d / ".hidden").write_text("x")
    (d / MANIFEST_NAME).write_text("{}")  # an old manifest is not part of the model
    return d


def test_build_lists_every_visible_file_with_size_and_digest(tmp_path: Path) -> None:
    m = build_manifest(_model(tmp_path))
    assert [f.path for f in m.files] == ["config.json", "sub/weights.bin"]
    assert m.files[1] == FileEntry("sub/weights.bin", 10, hashlib.sha256(b"\x00" * 10).hexdigest())
    assert m.total_bytes == 18
    assert m.digest == hashlib.sha256(m.raw).hexdigest()


def test_raw_is_canonical_and_parses_back(tmp_path: Path) -> None:
    m = build_manifest(_model(tmp_path))
    again = Manifest.from_files(list(reversed(m.files)))
    assert again.raw == m.raw and again.digest == m.digest
    assert Manifest.parse(m.raw, "store") == m


def test_build_refuses_a_missing_or_empty_directory(tmp_path: Path) -> None:
    with pytest.raises(SourceError, match="is not a directory"):
        build_manifest(tmp_path / "nope")
    (tmp_path / "empty" / ".git").mkdir(parents=True)
    with pytest.raises(SourceError, match="holds no file"):
        build_manifest(tmp_path / "empty")


def _doc(**change: Any) -> bytes:
    doc: dict[str, Any] = {
        "format": "servehall-manifest",
        "version": 1,
        "files": [{"path": "a.bin", "size": 3, "sha256": _SHA}],
    }
    doc.update(change)
    return json.dumps(doc).encode()


def _file(**change: Any) -> bytes:
    entry: dict[str, Any] = {"path": "a.bin", "size": 3, "sha256": _SHA}
    entry.update(change)
    return _doc(files=[entry])


@pytest.mark.parametrize(
    ("raw", "why"),
    [
        (b"not json", "not JSON"),
        (b"[]", '"format"'),
        (_doc(format="other"), '"format"'),
        (_doc(version=2), "unknown version 2"),
        (_doc(files=[]), '"files" is not a non-empty list'),
        (_doc(files=["a.bin"]), "files[0] is not an object"),
        (_file(path="/etc/passwd"), "is not a relative path"),
        (_file(path="a/../../b"), "is not a relative path"),
        (_file(size=-1), "is not a byte count"),
        (_file(size=True), "is not a byte count"),
        (_file(sha256="xyz"), "is not 64 hex digits"),
        (_file(sha256="g" * 64), "is not 64 hex digits"),
        (_doc(files=[{"path": "a", "size": 1, "sha256": _SHA}] * 2), "listed twice"),
    ],
)
def test_a_malformed_manifest_is_one_line_naming_the_origin(raw: bytes, why: str) -> None:
    with pytest.raises(SourceError) as err:
        Manifest.parse(raw, "s3://bucket/m")
    text = str(err.value)
    assert text.startswith(f"s3://bucket/m: malformed {MANIFEST_NAME}: ")
    assert why in text and "\n" not in text


def test_digests_are_kept_lowercase() -> None:
    m = Manifest.parse(_file(sha256="A" * 64), "x")
    assert m.files[0].sha256 == "a" * 64


@pytest.mark.parametrize("path", ["a", "a/b.bin", "x.y/z"])
def test_safe_paths(path: str) -> None:
    assert is_safe_path(path)


@pytest.mark.parametrize("path", ["", "/a", "a//b", "./a", "a/..", "a\\b", "a\0b", "a/"])
def test_unsafe_paths(path: str) -> None:
    assert not is_safe_path(path)


def test_sha256_file_reads_past_one_chunk(tmp_path: Path) -> None:
    data = bytes(range(256)) * 5000  # > 1 MiB
    f = tmp_path / "big"
    f.write_bytes(data)
    assert sha256_file(f) == hashlib.sha256(data).hexdigest()


def test_verify_names_each_missing_or_different_file(tmp_path: Path) -> None:
    d = _model(tmp_path)
    m = build_manifest(d)
    assert verify_dir(d, m) == []
    (d / "config.json").write_text('{"a": 2}')  # same size, other bytes
    (d / "sub" / "weights.bin").write_bytes(b"\x00" * 11)
    assert verify_dir(d, m) == [
        "config.json: SHA-256 differs from the manifest",
        "sub/weights.bin: 11 bytes, the manifest says 10",
    ]
    (d / "config.json").unlink()
    assert verify_dir(d, m)[0] == "config.json: missing"
