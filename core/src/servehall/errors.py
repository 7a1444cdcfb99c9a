"""The error tree of the host. Every error a client can see maps to the OpenAI error
envelope ``{"error": {"message", "type", "param", "code"}}`` with one HTTP status.

::

    ServehallError                       (500 server_error — never shown with a traceback)
    ├── InvalidRequestError              400 invalid_request_error  (param names the field)
    │   ├── ContextLengthExceededError   400 code=context_length_exceeded
    │   ├── ContentFilterError           400 code=content_filter
    │   └── UnsupportedParameterError    400 code=unsupported_parameter
    ├── AuthenticationError              401 authentication_error (+ WWW-Authenticate: Bearer)
    ├── PermissionDeniedError            403 permission_error
    ├── NotFoundError                    404 not_found_error (code=model_not_found for models)
    ├── PayloadTooLargeError             413 invalid_request_error
    ├── UnsupportedMediaTypeError        415 invalid_request_error
    ├── RateLimitError                   429 rate_limit_error (+ Retry-After, x-ratelimit-*)
    ├── ServiceUnavailableError          503 server_error (+ Retry-After)
    │   ├── QueueFullError               code=queue_full
    │   ├── QueueTimeoutError            code=queue_timeout
    │   └── EngineUnavailableError       code=engine_unavailable (worker died/restarting)
    ├── EngineError                      500 engine failure (message is user-safe)
    ├── ConfigError                      startup: a config file or section is invalid
    └── PluginError                      startup: a plugin cannot be loaded or served
"""

from __future__ import annotations

from typing import Any, ClassVar


class ServehallError(Exception):
    """Base class. ``status`` and ``type`` give the HTTP status and OpenAI error type."""

    status: ClassVar[int] = 500
    type: ClassVar[str] = "server_error"
    default_code: ClassVar[str | None] = None

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code if code is not None else self.default_code
        self.headers: dict[str, str] = dict(headers or {})

    def envelope(self) -> dict[str, Any]:
        """The OpenAI error body: ``{"error": {"message", "type", "param", "code"}}``."""
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }


class InvalidRequestError(ServehallError):
    status = 400
    type = "invalid_request_error"


class ContextLengthExceededError(InvalidRequestError):
    default_code = "context_length_exceeded"


class ContentFilterError(InvalidRequestError):
    default_code = "content_filter"


class UnsupportedParameterError(InvalidRequestError):
    default_code = "unsupported_parameter"


class AuthenticationError(ServehallError):
    """A credential was missing or bad. Raised by auth plugins for a bad credential."""

    status = 401
    type = "authentication_error"
    default_code = "invalid_api_key"

    def __init__(self, message: str = "Invalid or missing API key.", **kw: Any) -> None:
        super().__init__(message, **kw)
        self.headers.setdefault("WWW-Authenticate", "Bearer")


class PermissionDeniedError(ServehallError):
    status = 403
    type = "permission_error"
    default_code = "permission_denied"


class NotFoundError(ServehallError):
    status = 404
    type = "not_found_error"


class ConflictError(ServehallError):
    """409: the object is in a state that does not allow the request (e.g. cancelling
    a batch that already completed)."""

    status = 409
    type = "invalid_request_error"
    default_code = "conflict"


class PayloadTooLargeError(ServehallError):
    status = 413
    type = "invalid_request_error"
    default_code = "payload_too_large"


class UnsupportedMediaTypeError(ServehallError):
    status = 415
    type = "invalid_request_error"
    default_code = "unsupported_media_type"


class RateLimitError(ServehallError):
    """Over a rate limit. ``headers`` should carry ``Retry-After`` (seconds)."""

    status = 429
    type = "rate_limit_error"
    default_code = "rate_limit_exceeded"


class ServiceUnavailableError(ServehallError):
    status = 503
    type = "server_error"
    default_code = "service_unavailable"


class QueueFullError(ServiceUnavailableError):
    default_code = "queue_full"


class QueueTimeoutError(ServiceUnavailableError):
    default_code = "queue_timeout"


class EngineUnavailableError(ServiceUnavailableError):
    """The model's engine is not running (its worker died, is restarting, or is in a
    crash loop). Carries ``Retry-After``."""

    default_code = "engine_unavailable"


class EngineError(ServehallError):
    default_code = "engine_error"


class ConfigError(ServehallError):
    """Invalid configuration. ``errors`` lists ``(key_path, message)`` pairs."""

    def __init__(self, message: str, errors: list[tuple[str, str]] | None = None) -> None:
        super().__init__(message)
        self.errors = errors or []


class PluginError(ServehallError):
    """A plugin cannot be loaded, is unknown, or targets an incompatible hook API."""


def status_of_code(code: str) -> int | None:
    """The HTTP status of the error whose ``default_code`` is ``code`` (e.g.
    ``"engine_unavailable"`` → 503), or None for a code no error class declares.

    An error inside a 200 stream is an SSE event carrying only the envelope (OpenAI's
    shape: ``message``, ``type``, ``param``, ``code``), whose ``type`` is ``server_error``
    for a 500 and a 503 alike; a client that must tell them apart (the accounting soak)
    reads the status from the code."""
    pending: list[type[ServehallError]] = [ServehallError]
    while pending:
        cls = pending.pop()
        if cls.default_code == code:
            return cls.status
        pending.extend(cls.__subclasses__())
    return None
