"""``/admin/config``: the running config revision, and live config changes (admin scope).

``GET /admin/config`` answers ``{"revision", "hash", "format", "text"}`` (the text as
applied, in its stored form: references stay references, literal secrets are
``{ redacted = true }``; posting it back takes them from the running config).
``POST /admin/config`` with ``{"text": "...", "format": "toml" | "yaml"}``
validates and applies it live
(:mod:`servehall.rollout.live`): 200 with what changed, or 400 ``config_invalid`` whose
message lists every error (nothing changed). A body over :data:`MAX_CONFIG_BYTES` is a
413 ``payload_too_large`` (:func:`servehall.api.body.read_body`: from a declared
``Content-Length`` before reading, else as soon as the bytes read pass the limit; the
rest is not read). 409 ``config_live_off`` when the server runs without live config
(tests building an app without it).
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, Field
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from servehall.admission.principal import SCOPE_ADMIN, Principal
from servehall.api.body import read_body
from servehall.errors import (
    AuthenticationError,
    ConfigError,
    InvalidRequestError,
    PermissionDeniedError,
    ServehallError,
)

MAX_CONFIG_BYTES = 1024 * 1024
"""Largest ``POST /admin/config`` body, in bytes (a larger one is a 413
``payload_too_large``, refused while reading)."""
FORMATS = ("toml", "yaml")
"""The config formats ``POST /admin/config`` takes (default ``toml``)."""


class ConfigChange(BaseModel):
    """``POST /admin/config``'s JSON body (the OpenAPI document's request schema; at most
    :data:`MAX_CONFIG_BYTES` bytes). ``text`` is a whole config; only ``[[models]]`` may
    differ from the running one (:mod:`servehall.rollout.live`), else a 400."""

    text: str
    format: str = Field(default="toml", json_schema_extra={"enum": list(FORMATS)})


class ConfigReport(BaseModel):
    """``GET /admin/config``'s answer: the running revision (null without stored
    revisions) and hash, ``broadcast`` (``subscribed`` | ``lost``) with a Redis
    broadcast configured, ``last_error`` after a revision failed to apply, and the text
    as applied."""

    revision: int | None
    hash: str
    broadcast: Literal["subscribed", "lost"] | None = None
    last_error: str | None = None
    format: Literal["toml", "yaml"]
    text: str


class ConfigApplied(BaseModel):
    """``POST /admin/config``'s answer (:meth:`servehall.rollout.live.ApplyResult.as_dict`):
    the new revision and the version keys (``name`` / ``name@version``) added, removed,
    reweighted, and ``kept_rollbacks``: canaries left rolled back at weight 0."""

    revision: int | None
    added: list[str]
    removed: list[str]
    reweighted: list[str]
    kept_rollbacks: list[str]


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
    report = ConfigReport.model_validate({**live.report(), "format": live.fmt, "text": live.text})
    return JSONResponse(report.model_dump(mode="json", exclude_unset=True))


async def post_config(request: Request) -> Response:
    """``POST /admin/config`` (see the module docstring).

    Raises:
        PayloadTooLargeError: 413, the body is over :data:`MAX_CONFIG_BYTES`.
        InvalidRequestError: 400, a bad body or an invalid config (nothing changed).
    """
    principal = _admin(request)
    live = _live(request)
    raw = await read_body(request, MAX_CONFIG_BYTES)
    try:
        body = json.loads(raw)
    except ValueError:
        raise InvalidRequestError(
            'The body must be JSON: {"text": "...", "format": "toml"}.', code="config_invalid"
        ) from None
    if not isinstance(body, dict) or not isinstance(body.get("text"), str):
        raise InvalidRequestError("Field 'text' (a string) is required.", param="text")
    fmt = body.get("format", "toml")
    if fmt not in FORMATS:
        raise InvalidRequestError("Field 'format' must be 'toml' or 'yaml'.", param="format")
    try:
        result = await live.apply_text(body["text"], fmt, f"api:{principal.id}")
    except ConfigError as exc:
        raise InvalidRequestError(exc.message, code="config_invalid") from None
    return JSONResponse(ConfigApplied.model_validate(result.as_dict()).model_dump(mode="json"))
