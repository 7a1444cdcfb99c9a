"""``/admin/config``: the running config revision, and live config changes (admin scope).

``GET /admin/config`` answers ``{"revision", "hash", "format", "text"}`` (the text as
applied, in its stored form: references stay references, literal secrets are
``{ redacted = true }``; posting it back takes them from the running config).
``POST /admin/config`` with ``{"text": "...", "format": "toml" | "yaml"}``
validates and applies it live
(:mod:`servehall.rollout.live`): 200 with what changed, or 400 ``config_invalid`` whose
message lists every error (nothing changed). 409 ``config_live_off`` when the server
runs without live config (tests building an app without it).
"""

from __future__ import annotations

import json
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from servehall.admission.principal import SCOPE_ADMIN, Principal
from servehall.errors import (
    AuthenticationError,
    ConfigError,
    InvalidRequestError,
    PermissionDeniedError,
    ServehallError,
)

_MAX_CONFIG_BYTES = 1024 * 1024


class _Conflict(ServehallError):
    status = 409
    type = "invalid_request_error"


def _admin(request: Request) -> Principal:
    principal = getattr(request.state, "principal", None)
    if not isinstance(principal, Principal):
        raise AuthenticationError("Authentication required.")
    if not principal.has_scope(SCOPE_ADMIN):
        raise PermissionDeniedError(
            "This credential lacks the 'admin' scope.", code="insufficient_scope"
        )
    return principal


def _live(request: Request) -> Any:
    live = getattr(request.app.state.api, "live", None)
    if live is None:
        raise _Conflict("Live config changes are off on this server.", code="config_live_off")
    return live


async def get_config(request: Request) -> Response:
    """``GET /admin/config`` (see the module docstring)."""
    _admin(request)
    live = _live(request)
    return JSONResponse({**live.report(), "format": live.fmt, "text": live.text})


async def post_config(request: Request) -> Response:
    """``POST /admin/config`` (see the module docstring)."""
    principal = _admin(request)
    live = _live(request)
    raw = await request.body()
    if len(raw) > _MAX_CONFIG_BYTES:
        raise InvalidRequestError("The config is larger than 1 MiB.", code="config_invalid")
    try:
        body = json.loads(raw)
    except ValueError:
        raise InvalidRequestError(
            'The body must be JSON: {"text": "...", "format": "toml"}.', code="config_invalid"
        ) from None
    if not isinstance(body, dict) or not isinstance(body.get("text"), str):
        raise InvalidRequestError("Field 'text' (a string) is required.", param="text")
    fmt = body.get("format", "toml")
    if fmt not in ("toml", "yaml"):
        raise InvalidRequestError("Field 'format' must be 'toml' or 'yaml'.", param="format")
    try:
        result = await live.apply_text(body["text"], fmt, f"api:{principal.id}")
    except ConfigError as exc:
        raise InvalidRequestError(exc.message, code="config_invalid") from None
    return JSONResponse(result.as_dict())
