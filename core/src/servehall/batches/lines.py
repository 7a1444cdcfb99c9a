"""The lines of a batch's output and error files, OpenAI's format (one JSON object per
line)::

    {"id": "batch_req_…", "custom_id": "…",
     "response": {"status_code": 200, "request_id": "chatcmpl-…", "body": {…}},
     "error": null}

A request that ran and succeeded (2xx) goes to the output file with ``error`` null. One
that ran and failed goes to the error file with its response (the OpenAI error envelope
as ``body``) and ``error: {code, message}`` taken from that envelope. A line that never
ran (the completion window passed: ``batch_expired``; a body the runner cannot send:
``invalid_request``) has ``response: null``.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

EXPIRED_CODE = "batch_expired"
EXPIRED_MESSAGE = "This request could not be executed before the completion window expired."


def _line(custom_id: str, response: dict[str, Any] | None, error: dict[str, Any] | None) -> str:
    return json.dumps(
        {
            "id": "batch_req_" + uuid.uuid4().hex,
            "custom_id": custom_id,
            "response": response,
            "error": error,
        },
        ensure_ascii=False,
        separators=(",", ":"),
    )


def error_of(status_code: int, body: Any) -> dict[str, Any] | None:
    """``{code, message}`` of a failed response (None for a 2xx): the envelope's code
    and message, or the status when the body is no envelope."""
    if 200 <= status_code < 300:
        return None
    err = body.get("error") if isinstance(body, dict) else None
    if isinstance(err, dict):
        code = err.get("code") or err.get("type") or f"http_{status_code}"
        return {"code": str(code), "message": str(err.get("message") or "")}
    return {"code": f"http_{status_code}", "message": f"The request failed ({status_code})."}


def response_line(custom_id: str, status_code: int, request_id: str | None, body: Any) -> str:
    """The line of a request that ran: ``response`` is ``{status_code, request_id,
    body}``; ``error`` per :func:`error_of`."""
    response = {"status_code": status_code, "request_id": request_id, "body": body}
    return _line(custom_id, response, error_of(status_code, body))


def unrun_line(custom_id: str, code: str, message: str) -> str:
    """The line of a request that never ran: ``response`` null, ``error {code, message}``."""
    return _line(custom_id, None, {"code": code, "message": message})


def expired_line(custom_id: str) -> str:
    """The ``batch_expired`` line of a request the completion window left unrun."""
    return unrun_line(custom_id, EXPIRED_CODE, EXPIRED_MESSAGE)
