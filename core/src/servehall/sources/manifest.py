"""``servehall-manifest.json``: the size and SHA-256 digest of every file of a model.

Written by ``servehall models push`` next to the model's files in the store; a pull
checks every downloaded file against it and keeps a copy in the cached directory
(``servehall models verify`` reads that copy). Format::

    {"format": "servehall-manifest", "version": 1,
     "files": [{"path": "config.json", "size": 123, "sha256": "<64 hex>"}, ...]}

``path`` is relative, ``/``-separated, without ``.`` or ``..`` parts.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from servehall.sources.errors import SourceError

MANIFEST_NAME = "servehall-manifest.json"
"""The manifest's object name beside the model's files (and its name in the cache)."""

_CHUNK = 1024 * 1024


@dataclass(frozen=True)
class FileEntry:
    """One file: its relative path, size in bytes and SHA-256 (lowercase hex)."""

    path: str
    size: int
    sha256: str


@dataclass(frozen=True)
class Manifest:
    """Every file of one model, sorted by path. ``raw`` is the JSON it was read from
    (its digest names the cache entry)."""

    files: tuple[FileEntry, ...]
    raw: bytes

    @property
    def total_bytes(self) -> int:
        """The sum of the files' sizes."""
        return sum(f.size for f in self.files)

    @property
    def digest(self) -> str:
        """SHA-256 (hex) of the manifest's bytes: the identity of the model's content."""
        return hashlib.sha256(self.raw).hexdigest()

    @classmethod
    def from_files(cls, files: list[FileEntry]) -> Manifest:
        """A manifest of ``files`` (sorted), with its canonical JSON as ``raw``."""
        ordered = tuple(sorted(files, key=lambda f: f.path))
        doc = {
            "format": "servehall-manifest",
            "version": 1,
            "files": [{"path": f.path, "size": f.size, "sha256": f.sha256} for f in ordered],
        }
        raw = (json.dumps(doc, indent=1, sort_keys=True) + "\n").encode()
        return cls(ordered, raw)

    @classmethod
    def parse(cls, raw: bytes, origin: str) -> Manifest:
        """Read a manifest's JSON.

        Raises:
            SourceError: one line naming ``origin``: not JSON, a missing or wrong field,
                an unsafe path (absolute, ``..``), a path listed twice, no files.
        """

        def bad(why: str) -> SourceError:
            return SourceError(f"{origin}: malformed {MANIFEST_NAME}: {why}")

        try:
            doc: Any = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as exc:
            raise bad(f"not JSON ({exc})") from None
        if not isinstance(doc, dict) or doc.get("format") != "servehall-manifest":
            raise bad('no "format": "servehall-manifest"')
        if doc.get("version") != 1:
            raise bad(f"unknown version {doc.get('version')!r} (this servehall reads 1)")
        items = doc.get("files")
        if not isinstance(items, list) or not items:
            raise bad('"files" is not a non-empty list')
        files: list[FileEntry] = []
        seen: set[str] = set()
        for i, item in enumerate(items):
            if not isinstance(item, dict):
                raise bad(f"files[{i}] is not an object")
            path, size, sha = item.get("path"), item.get("size"), item.get("sha256")
            if not isinstance(path, str) or not is_safe_path(path):
                raise bad(f"files[{i}].path {path!r} is not a relative path inside the model")
            if path in seen:
                raise bad(f"files[{i}].path {path!r} is listed twice")
            if not isinstance(size, int) or isinstance(size, bool) or size < 0:
                raise bad(f"files[{i}].size of {path!r} is not a byte count")
            if not isinstance(sha, str) or len(sha) != 64 or not _is_hex(sha):
                raise bad(f"files[{i}].sha256 of {path!r} is not 64 hex digits")
            seen.add(path)
            files.append(FileEntry(path, size, sha.lower()))
        return cls(tuple(sorted(files, key=lambda f: f.path)), raw)


def _is_hex(text: str) -> bool:
    try:
        int(text, 16)
    except ValueError:
        return False
    return True


def is_safe_path(path: str) -> bool:
    """True for a relative, ``/``-separated path with no empty, ``.`` or ``..`` part."""
    if not path or path.startswith("/") or "\\" in path or "\0" in path:
        return False
    return all(part not in ("", ".", "..") for part in path.split("/"))


def sha256_file(path: Path) -> str:
    """SHA-256 (hex) of the file at ``path`` (read in 1 MiB chunks). OSError as raised."""
    h = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def build_manifest(model_dir: Path) -> Manifest:
    """The manifest of every regular file under ``model_dir`` (symlinks followed; the
    manifest file itself and hidden entries, such as ``.git``, left out).

    Raises:
        SourceError: ``model_dir`` is not a directory or holds no file.
    """
    if not model_dir.is_dir():
        raise SourceError(f"{model_dir} is not a directory")
    files: list[FileEntry] = []
    for root, dirs, names in os.walk(model_dir, followlinks=True):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in sorted(names):
            if name.startswith(".") or (Path(root) == model_dir and name == MANIFEST_NAME):
                continue
            full = Path(root) / name
            if not full.is_file():
                continue
            rel = full.relative_to(model_dir).as_posix()
            files.append(FileEntry(rel, full.stat().st_size, sha256_file(full)))
    if not files:
        raise SourceError(f"{model_dir} holds no file")
    return Manifest.from_files(files)


def verify_dir(model_dir: Path, manifest: Manifest) -> list[str]:
    """Every file of ``manifest`` that is missing from ``model_dir`` or does not match
    (one line each, naming the file); empty when all match."""
    problems: list[str] = []
    for f in manifest.files:
        full = model_dir / f.path
        if not full.is_file():
            problems.append(f"{f.path}: missing")
        elif full.stat().st_size != f.size:
            problems.append(f"{f.path}: {full.stat().st_size} bytes, the manifest says {f.size}")
        elif sha256_file(full) != f.sha256:
            problems.append(f"{f.path}: SHA-256 differs from the manifest")
    return problems
