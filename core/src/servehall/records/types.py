"""Record shapes and the sink interface.

Times are UTC ``datetime``; durations are seconds (float); token counts are ints.
No record ever carries an API key, JWT or other secret.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol, runtime_checkable

from servehall.errors import ConfigError


@dataclass(slots=True)
class RequestRecord:
    """One row of ``request_log``: written once per request, whatever its outcome.

    ``finish_reason`` is the OpenAI value of the first choice (``stop``, ``length``,
    ``content_filter``) or ``client_disconnect`` / ``error``. ``filter_verdicts`` is a
    list of ``{"rule", "action", "stage", "count", "monitor"}`` dicts.
    ``prompt_text`` / ``completion_text`` are kept when ``store_prompts`` is True, or
    when it is None and ``[database] store_prompts`` is on: the request path copies
    ``store_prompts`` from the principal's policy (``principal.policy.store_prompts``,
    e.g. ``[auth.tenants.<name>] store_prompts``). The record bus drops the texts
    otherwise, before any sink sees the record. ``replica`` names
    the servehall replica that served the request (``[server] replica``); ``version``
    the version of the model that served it (``[[models]] version``; empty or None for
    an unversioned model). ``tool_calls`` names the functions the model called (every
    choice, in order; None when the request offered no tools); their arguments are only
    in ``completion_text``. ``batch_id`` and ``custom_id`` name the batch and line of a
    request the batch runner sent (None for every other request).
    """

    request_id: str
    received_at: datetime
    finished_at: datetime | None = None
    principal_id: str | None = None
    tenant: str | None = None
    model: str | None = None
    backend: str | None = None
    endpoint: str = ""
    status_code: int = 0
    error_code: str | None = None
    finish_reason: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    queue_time_s: float | None = None
    ttft_s: float | None = None
    latency_s: float | None = None
    stream: bool = False
    client_addr: str | None = None
    filter_verdicts: list[dict[str, Any]] = field(default_factory=list)
    prompt_text: str | None = None
    completion_text: str | None = None
    store_prompts: bool | None = None
    replica: str | None = None
    response_format: str | None = None
    tool_calls: list[str] | None = None
    version: str | None = None
    batch_id: str | None = None
    custom_id: str | None = None


@dataclass(slots=True)
class AuditEvent:
    """One row of ``audit_event``: an admin action or security event.

    ``actor`` is a principal id (or ``"system"``), ``action`` a dotted verb such as
    ``key.created``, ``config.loaded``, ``auth.failed``; ``details`` is JSON-able and
    holds no secret. ``prev_hash``/``hash`` are filled by the audit chain writer.
    ``event_id`` (a UUID4, hex, drawn when the event is made and kept in the spill file)
    identifies the event: the chain stores an id once, so a replayed event is not
    appended twice.
    """

    action: str
    actor: str = "system"
    target: str | None = None
    details: dict[str, Any] = field(default_factory=dict)
    at: datetime | None = None
    event_id: str = field(default_factory=lambda: uuid.uuid4().hex)


Record = RequestRecord | AuditEvent


@runtime_checkable
class Sink(Protocol):
    """A destination for records. Called off the request path, in batches."""

    name: str
    #: When True the host fails closed: if this sink cannot write and its buffer is
    #: exhausted, new requests get 503 instead of going unrecorded.
    required: bool

    async def start(self) -> None:
        """Open connections/files. Raise to refuse startup."""
        ...

    async def write(self, records: Sequence[Record]) -> None:
        """Persist a batch, in order. Raise on failure; the bus retries with backoff."""
        ...

    async def close(self) -> None:
        """Flush and close. Idempotent."""
        ...

    # Optional: ``async def check(self) -> None`` — raise when the sink could not record
    # now (e.g. its database is unreachable). The runner calls it while idle, every
    # ``check_interval_s``, so readiness sees an outage without traffic. Not part of
    # the protocol's required members: sinks without it are simply not probed.


@dataclass(frozen=True, slots=True)
class SinkSpec:
    """A sink kind a plugin offers: ``factory(options: dict, settings) -> Sink``."""

    name: str
    factory: Callable[..., Sink]
    description: str = ""


def check_sink_options(kind: str, options: Mapping[str, Any], known: Collection[str]) -> None:
    """Reject sink ``options`` keys not in ``known`` (for ``SinkSpec`` factories).

    Raises:
        ConfigError: naming the sink ``kind``, the unknown keys (sorted) and the known ones.
    """
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise ConfigError(
            f"{kind} sink: unknown option(s) {', '.join(unknown)}; known: {', '.join(known)}"
        )
