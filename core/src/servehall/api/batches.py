"""``/v1/batches``: OpenAI's Batch API — create, retrieve, list, cancel.

* ``POST /v1/batches`` — JSON ``{input_file_id, endpoint, completion_window: "24h",
  metadata?}``; answers the batch object (status ``validating``). The input file must
  be the caller's (another principal's or an unknown id is a 404 ``file_not_found``)
  with purpose ``batch``; every line's ``url`` must be ``endpoint`` (a 400
  ``invalid_batch_file`` naming the line), ``endpoint`` one of
  :data:`~servehall.files.validate.BATCH_URLS`, ``completion_window`` ``"24h"``,
  ``metadata`` at most 16 string pairs (keys ≤ 64, values ≤ 512 characters).
* ``GET /v1/batches`` — the caller's batches, newest first; query ``limit`` (1–100,
  default 20) and ``after`` (a batch id); ``{object: "list", data, first_id, last_id,
  has_more}``.
* ``GET /v1/batches/{batch_id}`` — the batch object; ``POST
  /v1/batches/{batch_id}/cancel`` — cancels a ``validating`` or ``in_progress`` batch
  (status ``cancelling``, then ``cancelled`` once its running lines end; its lines not
  started never run); a batch already cancelling or cancelled is answered as it is,
  one that ended otherwise is a 409 ``batch_not_cancellable``.

A batch is visible only to the principal that created it (another's id is a 404
``batch_not_found``, as an unknown one); every route needs the ``inference`` scope.
Creating and cancelling are audit events ``batch.created`` / ``batch.cancelled`` (actor
the principal, target the batch id). The lines run in the background
(:mod:`servehall.batches.runner`).
"""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any

from pydantic import BaseModel, Field
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from servehall.admission.principal import Principal
from servehall.api.body import read_json_object
from servehall.api.files import caller, storage_errors
from servehall.api.offload import run_heavy
from servehall.api.paging import list_page, query_limit
from servehall.api.state import ApiState
from servehall.batches.principals import principal_to_json
from servehall.batches.store import Batch, BatchStore, NewLine, UnknownCursor, body_text
from servehall.errors import ConflictError, InvalidRequestError, NotFoundError
from servehall.files.catalog import FileRow
from servehall.files.store import FileStore
from servehall.files.validate import BATCH_URLS, CODE, check_line
from servehall.records.types import AuditEvent

COMPLETION_WINDOWS = {"24h": timedelta(hours=24)}
"""The completion windows a batch may ask for (OpenAI's: ``24h``)."""
MAX_LIST = 100
"""The largest ``limit`` of ``GET /v1/batches``."""
DEFAULT_LIST = 20
"""The ``limit`` of ``GET /v1/batches`` when none is given."""
MAX_METADATA = 16
"""Most metadata pairs (OpenAI's limit)."""
MAX_METADATA_KEY = 64
"""Longest metadata key, in characters."""
MAX_METADATA_VALUE = 512
"""Longest metadata value, in characters."""


class BatchCreateRequest(BaseModel):
    """The JSON body of ``POST /v1/batches`` as :func:`create_batch` checks it (the
    OpenAPI document's request schema; other keys are ignored). The handler checks each
    field itself, with these constants, to answer OpenAI's ``param`` and ``code``."""

    input_file_id: str = Field(min_length=1, description="A file of the caller, purpose batch")
    endpoint: str = Field(
        json_schema_extra={"enum": list(BATCH_URLS)},
        description="The url of every line of the input file",
    )
    completion_window: str = Field(json_schema_extra={"enum": list(COMPLETION_WINDOWS)})
    metadata: (
        dict[
            Annotated[str, Field(max_length=MAX_METADATA_KEY)],
            Annotated[str, Field(max_length=MAX_METADATA_VALUE)],
        ]
        | None
    ) = Field(default=None, max_length=MAX_METADATA)


async def _store(api: ApiState) -> BatchStore:
    return BatchStore((await api.files.catalog()).engine)


def _not_found(batch_id: str) -> NotFoundError:
    return NotFoundError(
        f"No such Batch object: {batch_id[:100]}", param="batch_id", code="batch_not_found"
    )


def _audit(api: ApiState, action: str, principal: Principal, batch: Batch) -> None:
    records = api.host.records
    if records is not None:
        records.audit(
            AuditEvent(
                action=action,
                actor=principal.id,
                target=batch.id,
                details={
                    "endpoint": batch.endpoint,
                    "input_file_id": batch.input_file_id,
                    "request_counts": batch.counts,
                },
            )
        )


def _field(body: dict[str, Any], name: str) -> str:
    value = body.get(name)
    if not isinstance(value, str) or not value:
        raise InvalidRequestError(f"'{name}' is required (a string).", param=name)
    return value


def _metadata(value: Any) -> dict[str, str] | None:
    if value is None:
        return None
    bad = InvalidRequestError(
        f"'metadata' must be an object of at most {MAX_METADATA} string pairs "
        f"(keys up to {MAX_METADATA_KEY}, values up to {MAX_METADATA_VALUE} characters).",
        param="metadata",
    )
    if not isinstance(value, dict) or len(value) > MAX_METADATA:
        raise bad
    for k, v in value.items():
        if not isinstance(v, str) or len(k) > MAX_METADATA_KEY or len(v) > MAX_METADATA_VALUE:
            raise bad
    return dict(value)


def _read_lines(store: FileStore, key: str, endpoint: str) -> list[NewLine]:
    """The lines of the input file under ``key`` (checked again, as at upload), each
    ``url`` equal to ``endpoint``; 400 ``invalid_batch_file`` naming the first bad
    line."""
    lines: list[NewLine] = []
    with store.open(key) as src:
        for number, raw in enumerate(src, start=1):
            if not raw.strip():
                continue
            custom_id = check_line(raw, number)
            obj = json.loads(raw)
            if obj["url"] != endpoint:
                raise InvalidRequestError(
                    f"Line {number}: 'url' {obj['url']!r} does not match the batch's "
                    f"endpoint {endpoint!r}; every line of a batch calls its endpoint.",
                    param="input_file_id",
                    code=CODE,
                )
            lines.append(NewLine(number, custom_id, body_text(obj["body"])))
    return lines


async def create_batch(request: Request) -> Response:
    """``POST /v1/batches`` (see the module docstring)."""
    principal = caller(request.scope)
    api: ApiState = request.app.state.api
    body = await read_json_object(request, api.host.settings.server.max_body_bytes)
    file_id = _field(body, "input_file_id")
    endpoint = _field(body, "endpoint")
    if endpoint not in BATCH_URLS:
        raise InvalidRequestError(
            f"'endpoint' must be one of {', '.join(BATCH_URLS)} (got {endpoint[:80]!r}).",
            param="endpoint",
            code="unsupported_endpoint",
        )
    window = _field(body, "completion_window")
    if window not in COMPLETION_WINDOWS:
        raise InvalidRequestError(
            f"'completion_window' must be one of {', '.join(COMPLETION_WINDOWS)} "
            f"(got {window[:40]!r}).",
            param="completion_window",
        )
    metadata = _metadata(body.get("metadata"))
    files = api.files
    catalog = await files.catalog()
    with storage_errors("read the file's record"):
        row: FileRow | None = await catalog.get(file_id, principal.id)
    if row is None:
        raise NotFoundError(
            f"No such File object: {file_id[:100]}", param="input_file_id", code="file_not_found"
        )
    if row.purpose != "batch":
        raise InvalidRequestError(
            f"File {row.id} has purpose {row.purpose!r}; a batch's input file has purpose 'batch'.",
            param="input_file_id",
        )
    with storage_errors("read the input file"):
        try:
            lines = await run_heavy(_read_lines, files.store, row.storage_key, endpoint)
        except FileNotFoundError:
            raise NotFoundError(
                f"The content of {row.id} is missing from the file store.",
                param="input_file_id",
                code="file_content_missing",
            ) from None
    if not lines:
        raise InvalidRequestError(
            "The input file holds no request.", param="input_file_id", code=CODE
        )
    now = datetime.now(UTC)
    store = BatchStore(catalog.engine)
    with storage_errors("record the batch"):
        batch = await store.create(
            batch_id="batch_" + uuid.uuid4().hex,
            owner=principal.id,
            principal=principal_to_json(principal),
            endpoint=endpoint,
            input_file_id=row.id,
            completion_window=window,
            metadata=metadata,
            lines=lines,
            now=now,
            expires_at=now + COMPLETION_WINDOWS[window],
        )
    _audit(api, "batch.created", principal, batch)
    return JSONResponse(batch.wire())


async def list_batches(request: Request) -> Response:
    """``GET /v1/batches`` (see the module docstring)."""
    principal = caller(request.scope)
    api: ApiState = request.app.state.api
    limit = query_limit(request, default=DEFAULT_LIST, most=MAX_LIST)
    store = await _store(api)
    try:
        with storage_errors("list the batches"):
            rows, more = await store.page(
                principal.id, after=request.query_params.get("after") or None, limit=limit
            )
    except UnknownCursor:
        raise InvalidRequestError(
            "'after' names no batch of this caller.", param="after", code="batch_not_found"
        ) from None
    return list_page(rows, more)


async def retrieve_batch(request: Request) -> Response:
    """``GET /v1/batches/{batch_id}``."""
    principal = caller(request.scope)
    api: ApiState = request.app.state.api
    batch_id = request.path_params["batch_id"]
    store = await _store(api)
    with storage_errors("read the batch"):
        batch = await store.get(batch_id, principal.id)
    if batch is None:
        raise _not_found(batch_id)
    return JSONResponse(batch.wire())


async def cancel_batch(request: Request) -> Response:
    """``POST /v1/batches/{batch_id}/cancel`` (see the module docstring)."""
    principal = caller(request.scope)
    api: ApiState = request.app.state.api
    batch_id = request.path_params["batch_id"]
    store = await _store(api)
    with storage_errors("cancel the batch"):
        got = await store.cancel(batch_id, principal.id, datetime.now(UTC))
    if got is None:
        raise _not_found(batch_id)
    batch, changed = got
    if changed:
        _audit(api, "batch.cancelled", principal, batch)
    elif batch.status not in ("cancelling", "cancelled"):
        raise ConflictError(
            f"Batch {batch.id} is {batch.status}; only a validating or in_progress batch "
            "can be cancelled.",
            param="batch_id",
            code="batch_not_cancellable",
        )
    return JSONResponse(batch.wire())
