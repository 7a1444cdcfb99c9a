"""The check of a batch input file at upload (``purpose = "batch"``), OpenAI's format.

The file is JSON lines, UTF-8; each non-blank line is one request::

    {"custom_id": "req-1", "method": "POST", "url": "/v1/chat/completions", "body": {...}}

``custom_id`` a non-empty string (at most :data:`MAX_CUSTOM_ID` characters) unique in
the file, ``method`` ``"POST"``, ``url`` one of :data:`BATCH_URLS`, ``body`` an object
(checked as a request only when the batch runs). Other keys are ignored. Blank lines
(whitespace only) are skipped but counted, so line numbers are those an editor shows.
A file with no request, or more than :data:`MAX_LINES`, is refused.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from servehall.errors import InvalidRequestError

BATCH_URLS = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings")
"""The endpoints a batch line may name."""
MAX_LINES = 50_000
"""Most requests one batch input file may hold (OpenAI's limit)."""
MAX_CUSTOM_ID = 512
"""Longest ``custom_id``, in characters."""
CODE = "invalid_batch_file"
"""The error code of every refusal here (``param`` is ``file``)."""


def _refuse(message: str) -> InvalidRequestError:
    return InvalidRequestError(message, param="file", code=CODE)


def _shown(value: Any) -> str:
    """A short rendering of a client's value for a message (at most 64 characters)."""
    text = json.dumps(value, ensure_ascii=False) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 64 else text[:63] + "…"


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def check_line(raw: bytes, number: int) -> str:
    """The ``custom_id`` of line ``number`` (1-based) whose bytes are ``raw``.

    Raises:
        InvalidRequestError: 400 ``invalid_batch_file``, param ``file``, the message
            starting ``Line <number>:`` and naming what is wrong.
    """
    where = f"Line {number}"
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise _refuse(f"{where}: not valid UTF-8.") from None
    try:
        obj = json.loads(text, parse_constant=_reject_constant)
    except (ValueError, RecursionError):
        raise _refuse(f"{where}: not valid JSON.") from None
    if not isinstance(obj, dict):
        raise _refuse(f"{where}: must be a JSON object with custom_id, method, url and body.")
    custom_id = obj.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        raise _refuse(f"{where}: 'custom_id' must be a non-empty string.")
    if len(custom_id) > MAX_CUSTOM_ID:
        raise _refuse(f"{where}: 'custom_id' is longer than {MAX_CUSTOM_ID} characters.")
    if obj.get("method") != "POST":
        raise _refuse(f"{where}: 'method' must be \"POST\" (got {_shown(obj.get('method'))}).")
    url = obj.get("url")
    if url not in BATCH_URLS:
        raise _refuse(f"{where}: 'url' must be one of {', '.join(BATCH_URLS)} (got {_shown(url)}).")
    if not isinstance(obj.get("body"), dict):
        raise _refuse(f"{where}: 'body' must be a JSON object (the request's body).")
    return custom_id


def check_batch_lines(lines: Iterable[bytes]) -> int:
    """Check every line of a batch input file (see the module docstring); the number of
    requests it holds.

    Raises:
        InvalidRequestError: 400 ``invalid_batch_file`` naming the first bad line (its
            1-based number and what is wrong: not JSON, a missing or wrong field, a
            ``custom_id`` already used on an earlier line), or an empty file.
    """
    seen: dict[str, int] = {}
    for number, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        custom_id = check_line(raw, number)
        first = seen.get(custom_id)
        if first is not None:
            raise _refuse(
                f"Line {number}: 'custom_id' {_shown(custom_id)} is already used on line "
                f"{first}; each line needs its own."
            )
        if len(seen) >= MAX_LINES:
            raise _refuse(f"Line {number}: a batch file holds at most {MAX_LINES} requests.")
        seen[custom_id] = number
    if not seen:
        raise _refuse("The file is empty; a batch file holds one JSON request per line.")
    return len(seen)
