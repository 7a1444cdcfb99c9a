"""Reading and parsing a JSON request body safely (step 1 of the request path).

Policy, in the order checked:

* ``Content-Type`` must be ``application/json`` (or ``application/*+json``, any charset
  that is UTF-8): another media type → 415; no ``Content-Type`` at all → 400;
* a declared ``Content-Length`` over ``server.max_body_bytes`` → 413 before reading;
  a chunked/streamed body is counted while read and refused with 413 as soon as it
  passes the limit (the rest is never buffered);
* the body must be valid UTF-8 JSON whose top level is an object: empty, broken,
  ``[]``, ``null`` → 400; the non-standard literals ``NaN``/``Infinity``/``-Infinity``
  → 400; nesting deeper than :data:`MAX_DEPTH` → 400;
* a lone UTF-16 surrogate escape (``"\\ud83d"`` without its pair) → 400: such strings
  cannot be encoded as UTF-8 anywhere downstream (tokenizer, request log);
* NUL (``\\u0000``) is ordinary text and is kept.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from typing import Any

from starlette.requests import Request
from starlette.types import Receive

from servehall.errors import InvalidRequestError, PayloadTooLargeError, UnsupportedMediaTypeError

MAX_DEPTH = 64
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
_OPENERS = frozenset(b"[{")


def _reject_constant(name: str) -> Any:
    raise InvalidRequestError(f"{name} is not a valid JSON number.", code="invalid_json")


def check_media_type(request: Request) -> None:
    """415 for a non-JSON ``Content-Type``, 400 when it is missing."""
    ctype = request.headers.get("content-type")
    if ctype is None:
        raise InvalidRequestError(
            "Missing Content-Type header; send the body as application/json.",
            code="missing_content_type",
        )
    media, _, params = ctype.partition(";")
    media = media.strip().lower()
    if not (
        media == "application/json"
        or (media.startswith("application/") and media.endswith("+json"))
    ):
        raise UnsupportedMediaTypeError(
            "Unsupported Content-Type; send the body as application/json."
        )
    charset = re.search(r"charset\s*=\s*\"?([\w-]+)", params, re.I)
    if charset and charset.group(1).lower() not in ("utf-8", "utf8"):
        raise UnsupportedMediaTypeError("Unsupported charset; send the body as UTF-8 JSON.")


async def read_body(request: Request, max_bytes: int) -> bytes:
    """The raw body, refusing with 413 once it would exceed ``max_bytes``."""
    declared = request.headers.get("content-length")
    too_large = PayloadTooLargeError(
        f"Request body exceeds the limit of {max_bytes} bytes.", param=None
    )
    if declared is not None:
        try:
            if int(declared) > max_bytes:
                raise too_large
        except ValueError:
            raise InvalidRequestError("Invalid Content-Length header.") from None
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > max_bytes:
            raise too_large
        chunks.append(chunk)
    return b"".join(chunks)


def _depth_ok(raw: bytes) -> bool:
    """Cheap upper bound on nesting: count brackets outside strings."""
    depth = 0
    in_str = False
    escape = False
    for b in raw:
        if in_str:
            if escape:
                escape = False
            elif b == 0x5C:
                escape = True
            elif b == 0x22:
                in_str = False
        elif b == 0x22:
            in_str = True
        elif b in _OPENERS:
            depth += 1
            if depth > MAX_DEPTH:
                return False
        elif b in (0x5D, 0x7D):
            depth -= 1
    return True


def _has_lone_surrogate(obj: Any) -> bool:
    if isinstance(obj, str):
        try:
            obj.encode("utf-8")
        except UnicodeEncodeError:
            return True
        return False
    if isinstance(obj, dict):
        return any(_has_lone_surrogate(k) or _has_lone_surrogate(v) for k, v in obj.items())
    if isinstance(obj, list):
        return any(_has_lone_surrogate(v) for v in obj)
    return False


def parse_json_object(raw: bytes) -> dict[str, Any]:
    """Parse ``raw`` per the module policy; raises InvalidRequestError (400)."""
    if not raw.strip():
        raise InvalidRequestError(
            "The request body is empty; expected a JSON object.", code="invalid_json"
        )
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidRequestError(
            "The request body is not valid UTF-8.", code="invalid_json"
        ) from None
    if (
        (b"[" in raw or b"{" in raw)
        and raw.count(b"[") + raw.count(b"{") > MAX_DEPTH
        and not _depth_ok(raw)
    ):
        raise InvalidRequestError(
            f"JSON nested deeper than {MAX_DEPTH} levels.", code="invalid_json"
        )
    try:
        data = json.loads(text, parse_constant=_reject_constant)
    except InvalidRequestError:
        raise
    except (ValueError, RecursionError) as exc:
        where = (
            f" (line {exc.lineno}, column {exc.colno})"
            if isinstance(exc, json.JSONDecodeError)
            else ""
        )
        raise InvalidRequestError(
            f"The request body is not valid JSON{where}.", code="invalid_json"
        ) from None
    if not isinstance(data, dict):
        raise InvalidRequestError("The request body must be a JSON object.", code="invalid_json")
    if _SURROGATE_ESCAPE.search(raw) and _has_lone_surrogate(data):
        raise InvalidRequestError(
            "The request contains a lone UTF-16 surrogate (an unpaired \\ud800-\\udfff "
            "escape); send valid Unicode.",
            code="invalid_unicode",
        )
    return data


async def drain_body(receive: Receive, timeout_s: float = 60.0) -> None:
    """Read and drop the rest of a request body after an early response (413, 401 …),
    until the body ends, the client goes away, or ``timeout_s`` passes. Keeps Hypercorn's
    bounded per-request queue flowing so the connection (and, on HTTP/2, its other
    streams) is not stalled; see :mod:`servehall.server.hypercorn.h2_workaround`."""
    with contextlib.suppress(Exception):
        async with asyncio.timeout(timeout_s):
            while True:
                message = await receive()
                if message["type"] != "http.request" or not message.get("more_body", False):
                    return


async def read_json_object(request: Request, max_bytes: int) -> dict[str, Any]:
    """Media type check, size-limited read and parse (see the module policy)."""
    check_media_type(request)
    raw = await read_body(request, max_bytes)
    return parse_json_object(raw)
