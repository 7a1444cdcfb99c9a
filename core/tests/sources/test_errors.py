"""Tests of servehall.sources.errors: every source failure is a one-line ConfigError; the
store being down is a retryable kind of it; an integrity failure names the file."""

from __future__ import annotations

from servehall.errors import ConfigError
from servehall.sources.errors import IntegrityError, SourceError, StoreUnavailableError


def test_hierarchy() -> None:
    assert issubclass(SourceError, ConfigError)
    assert issubclass(StoreUnavailableError, SourceError)
    assert issubclass(IntegrityError, SourceError)
    assert not issubclass(IntegrityError, StoreUnavailableError)


def test_integrity_error_names_the_file() -> None:
    err = IntegrityError(
        "weights/model.bin: SHA-256 differs from the manifest", "weights/model.bin"
    )
    assert err.file == "weights/model.bin"
    assert str(err) == "weights/model.bin: SHA-256 differs from the manifest"
    assert err.errors == []  # a source error names no config key


def test_messages_are_kept_as_given() -> None:
    assert str(StoreUnavailableError("s3://b/m: the store did not answer")) == (
        "s3://b/m: the store did not answer"
    )
