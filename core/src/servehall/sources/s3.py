"""S3-compatible stores (AWS S3, SeaweedFS, MinIO, Ceph RGW…) through boto3.

``s3://bucket/prefix``: the model's files are the objects ``prefix/<path>``. The
endpoint, region and key pair come from ``[model_store]``; unset ones from boto3's usual
sources (``AWS_ENDPOINT_URL``, ``AWS_REGION``, ``AWS_ACCESS_KEY_ID``,
``AWS_SECRET_ACCESS_KEY``, ``~/.aws``). With an explicit endpoint the requests use
path-style addressing (what most S3-compatible servers expect).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from servehall.config.models import ModelStoreSettings
from servehall.sources.errors import SourceError, StoreUnavailableError
from servehall.sources.store import Progress, write_chunks

_CHUNK = 1024 * 1024
_CREDENTIAL_CODES = {
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "AccessDenied",
    "InvalidToken",
    "ExpiredToken",
    "403",
}
_MISSING_CODES = {"NoSuchKey", "404", "NotFound"}


class S3Store:
    """The objects under ``s3://bucket/prefix`` (see the module docstring)."""

    def __init__(self, url: str, settings: ModelStoreSettings) -> None:
        try:
            import boto3
            from botocore.config import Config
        except ImportError:
            raise SourceError(f"{url}: s3:// sources need boto3 (pip install boto3)") from None
        self.url = url.rstrip("/")
        rest = url.partition("://")[2]
        self.bucket, _, prefix = rest.partition("/")
        self.prefix = prefix.strip("/")
        endpoint = settings.s3_endpoint_url
        cfg = Config(
            connect_timeout=settings.timeout_s,
            read_timeout=settings.timeout_s,
            retries={"max_attempts": 2, "mode": "standard"},
            s3={"addressing_style": "path"} if endpoint else {},
        )
        kw: dict[str, Any] = {"config": cfg}
        if endpoint:
            kw["endpoint_url"] = endpoint
        if settings.s3_region:
            kw["region_name"] = settings.s3_region
        if settings.s3_access_key_id is not None:
            kw["aws_access_key_id"] = settings.s3_access_key_id.get_secret_value()
        if settings.s3_secret_access_key is not None:
            kw["aws_secret_access_key"] = settings.s3_secret_access_key.get_secret_value()
        try:
            self._client = boto3.session.Session().client("s3", **kw)
        except Exception as exc:  # botocore's config errors (a bad region name, …)
            raise SourceError(f"{url}: cannot set up the S3 client: {exc}") from None

    def _key(self, name: str) -> str:
        return f"{self.prefix}/{name}" if self.prefix else name

    def _error(self, name: str, exc: Exception) -> SourceError:
        from botocore.exceptions import (
            ClientError,
            ConnectionError,
            HTTPClientError,
            NoCredentialsError,
            PartialCredentialsError,
        )

        where = f"{self.url}/{name}"
        if isinstance(exc, NoCredentialsError | PartialCredentialsError):
            return SourceError(
                f"{where}: no S3 credentials (set [model_store] s3_access_key_id and "
                "s3_secret_access_key, or AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY)"
            )
        if isinstance(exc, ClientError):
            err = exc.response.get("Error", {})
            code = str(err.get("Code", ""))
            status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)
            if code in _CREDENTIAL_CODES or status == 403:
                return SourceError(f"{where}: the store refused the credentials ({code})")
            if code in _MISSING_CODES or status == 404:
                return SourceError(f"{where}: no such object")
            if code == "NoSuchBucket":
                return SourceError(f"{where}: no bucket {self.bucket!r}")
            if status >= 500:
                return StoreUnavailableError(f"{where}: the store answered {status} ({code})")
            return SourceError(f"{where}: {code or status}: {err.get('Message', '')}".rstrip())
        if isinstance(exc, ConnectionError | HTTPClientError | OSError) or type(
            exc
        ).__module__.startswith("urllib3"):
            return StoreUnavailableError(f"{where}: the store is unreachable ({exc})")
        return SourceError(f"{where}: {type(exc).__name__}: {exc}")

    def read(self, name: str) -> bytes:
        """See :meth:`servehall.sources.store.Store.read`."""
        try:
            obj = self._client.get_object(Bucket=self.bucket, Key=self._key(name))
            return bytes(obj["Body"].read())
        except Exception as exc:
            raise self._error(name, exc) from None

    def download(self, name: str, dest: Path, progress: Progress) -> str:
        """See :meth:`servehall.sources.store.Store.download`."""
        try:
            obj = self._client.get_object(Bucket=self.bucket, Key=self._key(name))
            return write_chunks(obj["Body"].iter_chunks(_CHUNK), dest, progress)
        except SourceError:  # the local write (a full disk)
            raise
        except Exception as exc:
            raise self._error(name, exc) from None

    def upload(self, src: Path, name: str) -> None:
        """See :meth:`servehall.sources.store.Store.upload`."""
        try:
            self._client.upload_file(str(src), self.bucket, self._key(name))
        except Exception as exc:
            # boto3 raises S3UploadFailedError inside ``except ClientError`` without
            # ``from``: the ClientError is its __context__, not its __cause__
            cause = getattr(exc, "last_exception", None) or exc.__cause__ or exc.__context__
            raise self._error(name, cause if isinstance(cause, Exception) else exc) from None
