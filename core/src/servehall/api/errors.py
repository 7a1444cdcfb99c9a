"""Turning every failure into a small OpenAI error envelope (never a 422, never a trace).

* :func:`error_response` — a :class:`~servehall.errors.ServehallError` as a JSON response
  with its status and headers;
* :func:`from_validation_error` — a pydantic ``ValidationError`` as one 400
  ``InvalidRequestError`` whose ``param`` is the top-level field (``"messages"``,
  ``"max_tokens"``) and whose message lists at most :data:`MAX_LISTED_ERRORS` problems by
  location, without echoing the input;
* :func:`install_handlers` — Starlette exception handlers for 404/405 and anything
  unexpected (500 ``server_error`` with a generic message; the trace goes to the log).
"""

from __future__ import annotations

import logging
from typing import Any

from pydantic import ValidationError
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from servehall.errors import InvalidRequestError, NotFoundError, ServehallError

log = logging.getLogger("servehall.api")

MAX_LISTED_ERRORS = 5
"""How many validation problems an error message lists before summarising the rest."""
MAX_MESSAGE_CHARS = 2000
_UNION_TAGS = frozenset({"str", "int", "float", "bool", "none", "constrained-str"})


def error_response(exc: ServehallError, *, close: bool = False) -> JSONResponse:
    """``exc`` as a JSON response (status, envelope, headers such as ``Retry-After``)."""
    body = exc.envelope()
    msg = body["error"]["message"]
    if len(msg) > MAX_MESSAGE_CHARS:
        body["error"]["message"] = msg[: MAX_MESSAGE_CHARS - 1] + "…"
    headers = dict(exc.headers)
    if close:
        headers["Connection"] = "close"
    return JSONResponse(body, status_code=exc.status, headers=headers)


def _is_tag(part: int | str) -> bool:
    """A union-branch tag of pydantic's (``str``, ``list[str]``…), not a field name."""
    return isinstance(part, str) and (part in _UNION_TAGS or "[" in part)


def _loc(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif _is_tag(part):
            continue  # union-branch tags from pydantic, not field names
        else:
            out += f".{part}" if out else part
    return out


def _wrong_branches(errors: list[dict[str, Any]]) -> set[int]:
    """Indexes of the union branches the input was not meant for: a ``*_type`` error at
    a branch's root (``stop`` as a ``str`` when a list was sent) where another branch
    at the same place got further (``stop[0]: String should have at least 1
    character``). Pydantic reports every branch of a failed union; only the one whose
    type the input has says what is wrong with it."""
    roots = {
        i
        for i, e in enumerate(errors)
        if str(e.get("type", "")).endswith("_type") and e["loc"] and _is_tag(e["loc"][-1])
    }
    out = set()
    for i in roots:
        where = _loc(tuple(errors[i]["loc"]))
        if any(
            j not in roots and _loc(tuple(e["loc"])).startswith(where) for j, e in enumerate(errors)
        ):
            out.add(i)
    return out


def _message(e: Any) -> str:
    msg = str(e.get("msg", "invalid value"))
    if e.get("type") == "missing":
        return "is required"
    return msg.removeprefix("Value error, ")


_TYPE_PREFIX = "Input should be "


def _is_type_choice(e: dict[str, Any], first: str, msg: str) -> bool:
    """``e`` is another union branch's type error at a place whose first message is a
    type error too (``Input should be a valid string`` … ``a valid list``)."""
    return (
        str(e.get("type", "")).endswith("_type")
        and bool(e["loc"])
        and _is_tag(e["loc"][-1])
        and first.startswith(_TYPE_PREFIX)
        and msg.startswith(_TYPE_PREFIX)
        and msg.removeprefix(_TYPE_PREFIX) not in first
    )


def from_validation_error(exc: ValidationError) -> InvalidRequestError:
    """A 400 naming the first offending top-level field; the message lists the first
    :data:`MAX_LISTED_ERRORS` problems (deduplicated by location, without the union
    branches the input's type rules out: :func:`_wrong_branches`) and counts the rest."""
    seen: dict[str, str] = {}
    errors: list[dict[str, Any]] = [
        dict(e) for e in exc.errors(include_input=False, include_url=False)
    ]
    wrong = _wrong_branches(errors)
    for i, e in enumerate(errors):
        if i in wrong:
            continue
        where = _loc(tuple(e["loc"])) or "body"
        msg = _message(e)
        if where not in seen:
            seen[where] = msg
        elif _is_type_choice(e, seen[where], msg):
            # no branch of a union took the input's type: name them all
            seen[where] += " or " + msg.removeprefix(_TYPE_PREFIX)
    items = list(seen.items())
    param = items[0][0].split("[")[0].split(".")[0] if items else None
    listed = [f"{k}: {m}" for k, m in items[:MAX_LISTED_ERRORS]]
    more = len(items) - len(listed)
    text = "Invalid request: " + "; ".join(listed)
    if more > 0:
        text += f"; and {more} more error(s)"
    return InvalidRequestError(text, param=param if param != "body" else None)


def plain_error(
    status: int, message: str, *, type: str = "invalid_request_error", code: str | None = None
) -> JSONResponse:
    """An envelope response for statuses without a ServehallError class (404 route, 405)."""
    body = {"error": {"message": message, "type": type, "param": None, "code": code}}
    return JSONResponse(body, status_code=status)


async def _http_exception(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    if exc.status_code == 404:
        resp = error_response(NotFoundError("No such route.", code="not_found"))
    elif exc.status_code == 405:
        resp = plain_error(
            405, f"Method {request.method} is not allowed on this route.", code="method_not_allowed"
        )
    else:
        resp = plain_error(exc.status_code, str(exc.detail)[:200])
    if exc.headers:
        resp.headers.update(exc.headers)
    return resp


async def _servehall_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ServehallError)
    return error_response(exc)


async def _unexpected(request: Request, exc: Exception) -> Response:
    log.exception("unhandled error on %s %s", request.method, request.url.path)
    return error_response(ServehallError("The server had an error processing the request."))


def install_handlers(app: Starlette) -> None:
    """Register the envelope handlers on ``app``."""
    app.add_exception_handler(HTTPException, _http_exception)
    app.add_exception_handler(ServehallError, _servehall_error)
    app.add_exception_handler(Exception, _unexpected)
