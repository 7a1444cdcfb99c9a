"""OpenAI's cursor pages, shared by the list routes (``GET /v1/files``,
``GET /v1/batches``): the ``limit`` query parameter and the list envelope
``{object: "list", data, first_id, last_id, has_more}``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from starlette.requests import Request
from starlette.responses import JSONResponse

from servehall.errors import InvalidRequestError


class Listed(Protocol):
    """An object of a page: its ``id`` and its wire form."""

    @property
    def id(self) -> str: ...

    def wire(self) -> dict[str, Any]: ...


def query_limit(request: Request, *, default: int, most: int) -> int:
    """The ``limit`` query parameter: ``default`` when absent.

    Raises:
        InvalidRequestError: 400 (``param: "limit"``) — not an integer from 1 to ``most``.
    """
    raw = request.query_params.get("limit")
    if raw is None:
        return default
    try:
        limit = int(raw)
    except ValueError:
        limit = 0
    if not 1 <= limit <= most:
        raise InvalidRequestError(f"'limit' must be an integer from 1 to {most}.", param="limit")
    return limit


def list_page(items: Sequence[Listed], has_more: bool) -> JSONResponse:
    """The list envelope of ``items`` (in page order); ``has_more``: a page follows."""
    return JSONResponse(
        {
            "object": "list",
            "data": [x.wire() for x in items],
            "first_id": items[0].id if items else None,
            "last_id": items[-1].id if items else None,
            "has_more": has_more,
        }
    )
