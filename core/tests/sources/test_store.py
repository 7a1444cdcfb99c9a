"""``servehall.sources.store``: chunks written with their digest and progress, one line
for a file that cannot be written (a full disk says so), and the store of a URL."""

from __future__ import annotations

import errno
import hashlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from servehall.config.models import ModelStoreSettings
from servehall.sources.errors import SourceError
from servehall.sources.store import _write_error, open_store, write_chunks


def test_chunks_are_written_hashed_and_reported(tmp_path: Path) -> None:
    seen: list[int] = []
    dest = tmp_path / "w.bin"
    dest.write_bytes(b"old content that is longer")
    digest = write_chunks([b"ab", b"", b"cde"], dest, seen.append)
    assert dest.read_bytes() == b"abcde"  # truncated, not appended
    assert digest == hashlib.sha256(b"abcde").hexdigest()
    assert seen == [2, 0, 3]


def test_an_unwritable_destination_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(SourceError, match=r"cannot write .*missing/dir/f"):
        write_chunks([b"x"], tmp_path / "missing" / "dir" / "f", lambda n: None)


def test_a_full_disk_says_so() -> None:
    err = _write_error(Path("/m/f"), OSError(errno.ENOSPC, "No space left on device"))
    assert str(err).startswith("disk full writing /m/f")
    assert "cache_max_bytes" in str(err)


def test_what_the_chunks_raise_passes_through(tmp_path: Path) -> None:
    def chunks() -> Iterator[bytes]:
        yield b"a"
        raise ConnectionResetError("peer")

    with pytest.raises(ConnectionResetError):
        write_chunks(chunks(), tmp_path / "f", lambda n: None)


def test_the_store_of_a_url() -> None:
    settings = ModelStoreSettings()
    https = open_store("HTTPS://mirror.example/models/tiny", settings)
    assert type(https).__name__ == "HttpStore"
    assert type(open_store("http://mirror/x", settings)).__name__ == "HttpStore"
    with pytest.raises(SourceError, match="ftp://x/y: unknown scheme"):
        open_store("ftp://x/y", settings)
