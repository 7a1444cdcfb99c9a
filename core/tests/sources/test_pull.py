"""Tests of servehall.sources.pull against a real static HTTP mirror (``http.server``
serving a directory): verified download into the cache, reuse, resume of a partial pull,
integrity failures naming the file, the cached copy when the store is down, leases,
progress and eviction. (The S3 round trip is in ``test_push_pull.py``.)"""

from __future__ import annotations

import functools
import http.server
import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from servehall.config.models import ModelStoreSettings
from servehall.sources.cache import ModelCache
from servehall.sources.errors import IntegrityError, SourceError, StoreUnavailableError
from servehall.sources.manifest import MANIFEST_NAME, build_manifest
from servehall.sources.pull import PullProgress, pull
from servehall.testing.sockets import free_port


@pytest.fixture
def site(tmp_path: Path) -> Iterator[tuple[Path, str]]:
    """(directory served, its base URL)."""
    root = tmp_path / "site"
    root.mkdir()
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    handler.log_message = lambda *a: None  # type: ignore[attr-defined]
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield root, f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


def _publish(root: Path, name: str, seed: bytes = b"a", size: int = 50_000) -> Path:
    """A model directory on the mirror, with its manifest."""
    d = root / name
    (d / "weights").mkdir(parents=True)
    (d / "config.json").write_text(json.dumps({"seed": seed.decode()}))
    (d / "weights" / "model.bin").write_bytes(seed * size)
    (d / MANIFEST_NAME).write_bytes(build_manifest(d).raw)
    return d


def _settings(tmp_path: Path, **kw: object) -> ModelStoreSettings:
    return ModelStoreSettings.model_validate({"cache_dir": tmp_path / "cache", **kw})


def test_pull_verifies_caches_and_reuses(site: tuple[Path, str], tmp_path: Path) -> None:
    root, base = site
    src = _publish(root, "m")
    got = pull(f"{base}/m", _settings(tmp_path))
    assert (got.files_downloaded, got.bytes_downloaded) == (2, 50_000 + len('{"seed": "a"}'))
    assert got.path == tmp_path / "cache" / got.key and len(got.key) == 32
    assert (got.path / "weights" / "model.bin").read_bytes() == (
        src / "weights/model.bin"
    ).read_bytes()
    assert (got.path / MANIFEST_NAME).read_bytes() == (src / MANIFEST_NAME).read_bytes()
    assert got.lease is None and not got.offline
    again = pull(f"{base}/m/", _settings(tmp_path))
    assert (again.key, again.files_downloaded, again.bytes_downloaded) == (got.key, 0, 0)


def test_a_corrupted_file_is_refused_by_name(site: tuple[Path, str], tmp_path: Path) -> None:
    root, base = site
    src = _publish(root, "m")
    (src / "weights" / "model.bin").write_bytes(b"b" * 50_000)  # same size, other bytes
    with pytest.raises(
        IntegrityError, match=r"file weights/model.bin does not match .*SHA-256"
    ) as err:
        pull(f"{base}/m", _settings(tmp_path))
    assert err.value.file == "weights/model.bin"
    cache = ModelCache(tmp_path / "cache")
    assert cache.entries() == []
    assert not list((tmp_path / "cache").rglob("*.download"))
    (src / "weights" / "model.bin").write_bytes(b"a" * 10)
    with pytest.raises(IntegrityError, match="10 bytes, the manifest says 50000"):
        pull(f"{base}/m", _settings(tmp_path))


def test_an_interrupted_pull_resumes(site: tuple[Path, str], tmp_path: Path) -> None:
    root, base = site
    src = _publish(root, "m")
    key = build_manifest(src).digest[:32]
    partial = tmp_path / "cache" / f"{key}.partial" / "weights"
    partial.mkdir(parents=True)
    (partial / "model.bin").write_bytes((src / "weights" / "model.bin").read_bytes())
    got = pull(f"{base}/m", _settings(tmp_path))
    assert got.key == key and got.files_downloaded == 1  # only config.json
    assert not (tmp_path / "cache" / f"{key}.partial").exists()


def test_store_down_uses_the_cached_copy_or_says_so(site: tuple[Path, str], tmp_path: Path) -> None:
    root, base = site
    _publish(root, "m")
    first = pull(f"{base}/m", _settings(tmp_path))
    down = f"http://127.0.0.1:{free_port()}/m"
    with pytest.raises(StoreUnavailableError, match="no copy in the cache"):
        pull(down, _settings(tmp_path))
    # the URL the copy came from is remembered: with its store down, the copy is used
    ModelCache(tmp_path / "cache").remember(down, first.key)
    offline = pull(down, _settings(tmp_path), lease=True)
    assert offline.offline and offline.key == first.key and offline.files_downloaded == 0
    assert offline.lease is not None
    offline.lease.release()
    # evicted meanwhile: no copy after all
    import shutil

    shutil.rmtree(first.path)
    with pytest.raises(StoreUnavailableError, match="no copy in the cache"):
        pull(down, _settings(tmp_path))


def test_lease_keeps_the_model_from_eviction(site: tuple[Path, str], tmp_path: Path) -> None:
    root, base = site
    _publish(root, "a", b"a")
    _publish(root, "b", b"b")
    settings = _settings(tmp_path, cache_max_bytes=80_000)  # room for one model
    a = pull(f"{base}/a", settings, lease=True)
    assert a.lease is not None
    b = pull(f"{base}/b", settings)
    keys = {e.key for e in ModelCache(tmp_path / "cache").entries()}
    assert keys == {a.key, b.key}  # a is in use: over the bound rather than evicted
    a.lease.release()
    pull(f"{base}/b", settings)  # a pull evicts what no one uses any more
    assert {e.key for e in ModelCache(tmp_path / "cache").entries()} == {b.key}


def test_progress_reaches_the_totals(site: tuple[Path, str], tmp_path: Path) -> None:
    root, base = site
    _publish(root, "m", size=3_000_000)  # several chunks
    seen: list[tuple[int, int, int, int]] = []
    pull(
        f"{base}/m",
        _settings(tmp_path),
        on_progress=lambda p: seen.append(
            (p.files_done, p.files_total, p.bytes_done, p.bytes_total)
        ),
    )
    total = 3_000_000 + len('{"seed": "a"}')
    assert len(seen) >= 3 and all(s[1] == 2 and s[3] == total for s in seen)
    assert seen[-1][2] == total
    assert [s[2] for s in seen] == sorted(s[2] for s in seen)


def test_progress_description() -> None:
    p = PullProgress(files_done=3, files_total=7, bytes_done=12_500_000, bytes_total=40_000_000)
    assert p.describe() == "pulling 3/7 files, 12.5/40.0 MB"


def test_missing_model_and_unwritable_cache(site: tuple[Path, str], tmp_path: Path) -> None:
    root, base = site
    with pytest.raises(SourceError, match="no such file"):
        pull(f"{base}/absent", _settings(tmp_path))
    _publish(root, "m")
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(SourceError, match="cannot create the model cache"):
        pull(f"{base}/m", ModelStoreSettings(cache_dir=blocker / "cache"))
    if os.geteuid() != 0:
        ro = tmp_path / "ro"
        ro.mkdir()
        (ro / "by-url").mkdir()
        ro.chmod(0o555)
        try:
            with pytest.raises(SourceError, match="cannot create"):
                pull(f"{base}/m", ModelStoreSettings(cache_dir=ro))
        finally:
            ro.chmod(0o755)
