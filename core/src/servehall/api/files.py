"""``/v1/files``: OpenAI's Files API — upload, list, retrieve, content, delete.

* ``POST /v1/files`` — ``multipart/form-data`` with a ``file`` part and a ``purpose``
  field; answers the file object ``{id: "file-…", object: "file", bytes, created_at,
  filename, purpose, status: "processed"}``. Only ``purpose = "batch"`` is taken (other
  OpenAI purposes — ``user_data``, ``assistants``, ``fine-tune``, ``vision``, ``evals`` —
  are a 400 ``unsupported_purpose``); the file must be a batch input file
  (:mod:`servehall.files.validate`: a bad line is a 400 ``invalid_batch_file`` naming
  the line). A file over ``[files] max_bytes`` is a 413: a declared ``Content-Length``
  past the limit (plus :data:`MULTIPART_SLACK` for the framing) is refused before the
  body is read, a streamed body as soon as it passes it; the upload is spooled by
  Starlette's parser (memory, then a temporary file), never held whole in memory.
  Another media type is a 415.
* ``GET /v1/files`` — the caller's files, newest first; query ``purpose``, ``limit``
  (1–10,000, default 10,000), ``after`` (a file id: the page after it), ``order``
  (``asc`` | ``desc``); answers ``{object: "list", data, first_id, last_id, has_more}``.
* ``GET /v1/files/{file_id}`` — the file object; ``GET /v1/files/{file_id}/content`` —
  the bytes as uploaded; ``DELETE /v1/files/{file_id}`` — ``{id, object: "file",
  deleted: true}``.

A file is visible only to the principal that uploaded it (its ``id``; ``anonymous``
without auth): another principal's file id is a 404 ``file_not_found``, as an unknown
one. Every route needs the ``inference`` scope (403 ``insufficient_scope``). Uploads
and deletes are audit events ``file.uploaded`` / ``file.deleted`` (actor the principal,
target the file id, details purpose, bytes, sha256). Not request records: these routes
generate nothing (as ``/tokenize``). Storage failures are a 503 ``files_unavailable``
(:mod:`servehall.files.service`).
"""

from __future__ import annotations

import asyncio
import logging
import re
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any, BinaryIO, Literal, cast

from sqlalchemy.exc import SQLAlchemyError
from starlette.datastructures import FormData, UploadFile
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.types import Message, Receive, Scope, Send

from servehall.admission.principal import ANONYMOUS, SCOPE_INFERENCE, Principal
from servehall.api.body import drain_body
from servehall.api.errors import error_response
from servehall.api.offload import run_heavy
from servehall.api.paging import list_page, query_limit
from servehall.api.state import ApiState
from servehall.errors import (
    InvalidRequestError,
    NotFoundError,
    PayloadTooLargeError,
    PermissionDeniedError,
    ServehallError,
    UnsupportedMediaTypeError,
)
from servehall.files.catalog import FileRow, UnknownCursor
from servehall.files.service import FileService, unavailable
from servehall.files.store import CHUNK, StoredBlob
from servehall.files.validate import check_batch_lines
from servehall.files.wire import FileDeleted
from servehall.records.types import AuditEvent

log = logging.getLogger("servehall.files")

PURPOSES = ("batch",)
"""The purposes an upload may name."""
MULTIPART_SLACK = 64 * 1024
"""Bytes a multipart body may carry beyond ``[files] max_bytes``: boundaries, part
headers and the ``purpose`` field."""
MAX_FILENAME = 255
"""Longest filename kept, in characters (a longer one is cut)."""
MAX_LIST = 10_000
"""The largest ``limit`` of ``GET /v1/files`` (and its default)."""
LIST_ORDERS = ("asc", "desc")
"""The ``order`` values of ``GET /v1/files`` (by ``created_at``; default ``desc``)."""
MAX_FORM_FIELDS = 8
"""Most parts of an upload's multipart body (Starlette's parser refuses more: 400)."""
MAX_FIELD_BYTES = 64 * 1024
"""Largest non-file part of an upload (``purpose``), in bytes."""

UPLOAD_FORM: dict[str, Any] = {
    "type": "object",
    "required": ["file", "purpose"],
    "properties": {
        "file": {
            "type": "string",
            "format": "binary",
            "description": "The batch input file (JSONL: one request a line, "
            "servehall.files.validate); at most [files] max_bytes bytes.",
        },
        "purpose": {"type": "string", "enum": list(PURPOSES)},
    },
}
"""The JSON schema of ``POST /v1/files``'s ``multipart/form-data`` body (the OpenAPI
document's); :func:`upload` reads these two parts."""

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def caller(scope: Scope) -> Principal:
    """The caller, refused with 403 without the ``inference`` scope."""
    principal: Principal = scope.get("state", {}).get("principal") or ANONYMOUS
    if not principal.has_scope(SCOPE_INFERENCE):
        raise PermissionDeniedError(
            "This credential lacks the 'inference' scope.", code="insufficient_scope"
        )
    return principal


def _service(api: ApiState) -> FileService:
    return api.files


def _not_found(file_id: str) -> NotFoundError:
    return NotFoundError(
        f"No such File object: {file_id[:100]}", param="file_id", code="file_not_found"
    )


@contextmanager
def storage_errors(what: str) -> Iterator[None]:
    """Database and disk failures as a 503 ``files_unavailable`` (logged), never a 500."""
    try:
        yield
    except SQLAlchemyError as exc:
        log.warning("files: %s failed: %s", what, type(exc).__name__)
        raise unavailable(f"the database failed to {what}.") from None
    except OSError as exc:
        log.warning("files: %s failed: %s", what, exc)
        raise unavailable(f"the file store failed to {what}.") from None


def _audit(api: ApiState, action: str, principal: Principal, row: FileRow) -> None:
    records = api.host.records
    if records is not None:
        records.audit(
            AuditEvent(
                action=action,
                actor=principal.id,
                target=row.id,
                details={"purpose": row.purpose, "bytes": row.bytes, "sha256": row.sha256},
            )
        )


def _filename(upload: UploadFile) -> str:
    """The uploaded file's name without a directory or control characters, cut to
    :data:`MAX_FILENAME` characters (``file`` when none was sent)."""
    name = (upload.filename or "").replace("\\", "/").rsplit("/", 1)[-1]
    name = _CONTROL.sub("", name).strip()
    return name[:MAX_FILENAME] or "file"


class _Counted:
    """``receive`` that refuses (413) once the body passes ``limit`` bytes."""

    def __init__(self, receive: Receive, limit: int, error: PayloadTooLargeError) -> None:
        self.receive = receive
        self.limit = limit
        self.error = error
        self.size = 0

    async def __call__(self) -> Message:
        message = await self.receive()
        if message["type"] == "http.request":
            self.size += len(message.get("body", b""))
            if self.size > self.limit:
                raise self.error
        return message


def _too_large(max_bytes: int) -> PayloadTooLargeError:
    return PayloadTooLargeError(
        f"The file exceeds the limit of {max_bytes} bytes ([files] max_bytes).", param="file"
    )


def _check_media_type(request: Request) -> None:
    media = (request.headers.get("content-type") or "").partition(";")[0].strip().lower()
    if media != "multipart/form-data":
        raise UnsupportedMediaTypeError(
            "Send the file as multipart/form-data with a 'file' part and a 'purpose' field."
        )


def _check_declared(request: Request, limit: int, error: PayloadTooLargeError) -> None:
    declared = request.headers.get("content-length")
    if declared is None:
        return
    try:
        size = int(declared)
    except ValueError:
        raise InvalidRequestError("Invalid Content-Length header.") from None
    if size > limit:
        raise error


class UploadEndpoint:
    """ASGI endpoint of ``POST /v1/files`` (see the module docstring): a bounded read
    of the multipart body, then :func:`upload`; drains a body it did not read."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        api: ApiState = scope["app"].state.api
        body_read = False
        try:
            principal = caller(scope)
            service = _service(api)
            request = Request(scope, receive)
            _check_media_type(request)
            error = _too_large(service.max_bytes)
            limit = service.max_bytes + MULTIPART_SLACK
            _check_declared(request, limit, error)
            counted = Request(scope, _Counted(receive, limit, error))
            try:
                form = await counted.form(
                    max_files=1, max_fields=MAX_FORM_FIELDS, max_part_size=MAX_FIELD_BYTES
                )
            except HTTPException as exc:  # the parser's refusal of a broken body
                raise InvalidRequestError(
                    f"Invalid multipart body: {str(exc.detail)[:200]}", code="invalid_multipart"
                ) from None
            body_read = True
            try:
                response = await upload(api, principal, form)
            finally:
                await form.close()
        except ClientDisconnect:
            return
        except ServehallError as exc:
            close = isinstance(exc, PayloadTooLargeError) and scope.get("http_version") in (
                "1.0",
                "1.1",
            )
            response = error_response(exc, close=close)
        await response(scope, receive, send)
        if not body_read:
            await drain_body(receive)


def _put(service: FileService, key: str, src: BinaryIO) -> StoredBlob:
    src.seek(0)
    return service.store.put(key, src)


def _check_batch(src: BinaryIO) -> int:
    src.seek(0)
    return check_batch_lines(src)


async def upload(api: ApiState, principal: Principal, form: FormData) -> Response:
    """Store the file of ``form`` for ``principal``; its file object.

    Raises:
        InvalidRequestError: 400 — no ``purpose`` or ``file``, an unsupported purpose,
            a bad batch file (naming the line).
        PayloadTooLargeError: 413 — the file is over ``[files] max_bytes``.
        ServiceUnavailableError: 503 ``files_unavailable`` — storage failed.
    """
    service = _service(api)
    purpose = form.get("purpose")
    if not isinstance(purpose, str) or not purpose:
        raise InvalidRequestError("'purpose' is required (\"batch\").", param="purpose")
    if purpose not in PURPOSES:
        raise InvalidRequestError(
            f"Purpose {purpose[:40]!r} is not supported by this server; "
            f"supported: {', '.join(PURPOSES)}.",
            param="purpose",
            code="unsupported_purpose",
        )
    upload_file = form.get("file")
    if not isinstance(upload_file, UploadFile):
        raise InvalidRequestError("'file' is required (a file part).", param="file")
    src = cast(BinaryIO, upload_file.file)
    size = upload_file.size
    if size is None:
        size = await asyncio.to_thread(lambda: src.seek(0, 2))
    if size > service.max_bytes:
        raise _too_large(service.max_bytes)
    await run_heavy(_check_batch, src)
    catalog = await service.catalog()
    file_id = "file-" + uuid.uuid4().hex
    with storage_errors("store the file"):
        blob = await asyncio.to_thread(_put, service, file_id, src)
    row = FileRow(
        id=file_id,
        owner=principal.id,
        filename=_filename(upload_file),
        purpose=purpose,
        bytes=blob.size,
        created_at=datetime.now(UTC),
        sha256=blob.sha256,
        storage_key=file_id,
    )
    try:
        with storage_errors("record the file"):
            await catalog.add(row)
    except ServehallError:
        await asyncio.to_thread(service.store.delete, file_id)
        raise
    _audit(api, "file.uploaded", principal, row)
    return JSONResponse(row.wire())


async def list_files(request: Request) -> Response:
    """``GET /v1/files`` (see the module docstring)."""
    principal = caller(request.scope)
    api: ApiState = request.app.state.api
    params = request.query_params
    order = params.get("order", "desc")
    if order not in LIST_ORDERS:
        raise InvalidRequestError("'order' must be 'asc' or 'desc'.", param="order")
    limit = query_limit(request, default=MAX_LIST, most=MAX_LIST)
    catalog = await _service(api).catalog()
    try:
        with storage_errors("list the files"):
            rows, more = await catalog.list(
                principal.id,
                purpose=params.get("purpose") or None,
                after=params.get("after") or None,
                limit=limit,
                order=cast(Literal["asc", "desc"], order),
            )
    except UnknownCursor:
        raise InvalidRequestError(
            "'after' names no file of this caller.", param="after", code="file_not_found"
        ) from None
    return list_page(rows, more)


async def _owned(request: Request) -> tuple[ApiState, Principal, FileRow]:
    principal = caller(request.scope)
    api: ApiState = request.app.state.api
    file_id = request.path_params["file_id"]
    catalog = await _service(api).catalog()
    with storage_errors("read the file's record"):
        row = await catalog.get(file_id, principal.id)
    if row is None:
        raise _not_found(file_id)
    return api, principal, row


async def retrieve_file(request: Request) -> Response:
    """``GET /v1/files/{file_id}`` (see the module docstring)."""
    _, _, row = await _owned(request)
    return JSONResponse(row.wire())


async def file_content(request: Request) -> Response:
    """``GET /v1/files/{file_id}/content``: the bytes as uploaded.

    Raises:
        NotFoundError: 404 ``file_not_found`` (unknown or another principal's), or
            ``file_content_missing`` when the store lost the content.
    """
    api, _, row = await _owned(request)
    store = _service(api).store
    with storage_errors("read the file"):
        try:
            src = await asyncio.to_thread(store.open, row.storage_key)
        except FileNotFoundError:
            log.warning("files: the content of %s is missing from the store", row.id)
            raise NotFoundError(
                f"The content of {row.id} is missing from the file store.",
                param="file_id",
                code="file_content_missing",
            ) from None
    return StreamingResponse(
        _chunks(src),
        media_type="application/octet-stream",
        headers={"Content-Length": str(row.bytes)},
    )


async def _chunks(src: BinaryIO) -> AsyncIterator[bytes]:
    try:
        while chunk := await asyncio.to_thread(src.read, CHUNK):
            yield chunk
    finally:
        src.close()


async def delete_file(request: Request) -> Response:
    """``DELETE /v1/files/{file_id}``: ``{id, object: "file", deleted: true}``."""
    principal = caller(request.scope)
    api: ApiState = request.app.state.api
    file_id = request.path_params["file_id"]
    service = _service(api)
    catalog = await service.catalog()
    with storage_errors("delete the file's record"):
        row = await catalog.remove(file_id, principal.id)
    if row is None:
        raise _not_found(file_id)
    try:
        await asyncio.to_thread(service.store.delete, row.storage_key)
    except OSError as exc:  # the record is gone; the content is an orphan on disk
        log.warning("files: could not delete the content of %s: %s", row.id, exc)
    _audit(api, "file.deleted", principal, row)
    return JSONResponse(FileDeleted(id=row.id).model_dump(mode="json"))
