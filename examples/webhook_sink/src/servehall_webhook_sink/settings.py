"""The ``[webhook_sink]`` config section.

Example::

    [webhook_sink]
    url = "https://hooks.example/servehall"
    timeout_s = 5
    max_attempts = 3          # one try plus two retries
    backoff_s = 0.5           # doubled after each failed try
    concurrency = 32          # posts in flight at once (a batch is posted concurrently)
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, HttpUrl


class WebhookSettings(BaseModel):
    """``[webhook_sink]``: where request records are posted and how hard to try.

    ``url`` receives one ``POST`` per request record (JSON body, see
    :func:`servehall_webhook_sink.sink.record_payload`); a 2xx answer is a delivery, a
    timeout, connection error or 5xx/429 is retried up to ``max_attempts`` tries in all,
    waiting ``backoff_s`` × 2ⁿ seconds between tries; any other status is final. The
    records of one batch are posted concurrently, ``concurrency`` at a time.
    """

    model_config = ConfigDict(extra="forbid")

    url: HttpUrl
    timeout_s: float = Field(default=5.0, gt=0, le=60)
    max_attempts: int = Field(default=3, ge=1, le=10)
    backoff_s: float = Field(default=0.5, ge=0, le=30)
    concurrency: int = Field(default=32, ge=1, le=1024)
