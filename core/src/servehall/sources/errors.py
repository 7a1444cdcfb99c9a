"""What pulling a model from its source can fail on; each is a one-line
:class:`~servehall.errors.ConfigError` (``serve`` and ``config apply`` print it as is)."""

from __future__ import annotations

from servehall.errors import ConfigError


class SourceError(ConfigError):
    """A model source that cannot be used: unknown object, refused credentials, a
    malformed manifest, a full disk."""


class StoreUnavailableError(SourceError):
    """The store did not answer (connection refused, timeout, a 5xx): worth a retry."""


class IntegrityError(SourceError):
    """A downloaded file does not match the manifest (size or SHA-256).

    ``file`` is the file's path inside the model directory."""

    def __init__(self, message: str, file: str) -> None:
        super().__init__(message)
        self.file = file
