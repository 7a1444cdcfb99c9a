"""Admin HTTP API for API keys, for principals with the ``admin`` scope.

============================================  =============================================
``GET    /admin/keys[?tenant=T&all=true]``     list keys (``all``: include revoked)
``POST   /admin/keys``                         create; body ``{"tenant", "name", "scopes",
                                               "models", "rpm", "tpm", "priority",
                                               "max_priority", "expires_at"}``;
                                               201 with ``key`` (shown only here, once)
``GET    /admin/keys/{id}``                    one key (``id`` = ``sh-<key_id>`` or bare)
``POST   /admin/keys/{id}/revoke``             revoke (also ``DELETE /admin/keys/{id}``)
``POST   /admin/keys/{id}/rotate``             new secret; body ``{"overlap_s": 3600}``
                                               keeps the old one valid that long
============================================  =============================================

The host authenticates these routes like every other; this module checks the scope.
Errors use the OpenAI envelope. Every operation is an audit event (``key.listed``,
``key.viewed``, ``key.created``, ``key.revoked``, ``key.rotated``) with the caller as
actor.
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from sqlalchemy.exc import SQLAlchemyError
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from servehall import (
    SCOPE_ADMIN,
    AuditEvent,
    AuthenticationError,
    InvalidRequestError,
    NotFoundError,
    PermissionDeniedError,
    Principal,
    ServehallError,
    ServiceUnavailableError,
)
from servehall_auth.settings import PRIORITY_LIMIT
from servehall_auth.store import (
    AUDITED_KEY_FIELDS,
    KeyNotFoundError,
    KeyRecord,
    KeyStore,
    utcnow,
)

if TYPE_CHECKING:
    from servehall_auth.runtime import AuthRuntime

log = logging.getLogger("servehall_auth")


class CreateKeyBody(BaseModel):
    """Body of ``POST /admin/keys``."""

    model_config = ConfigDict(extra="forbid")

    tenant: str = Field(min_length=1, max_length=200)
    name: str | None = Field(default=None, max_length=200)
    scopes: list[str] = Field(default_factory=lambda: ["inference"], min_length=1)
    models: list[str] | None = None
    rpm: int | None = Field(default=None, ge=1)
    tpm: int | None = Field(default=None, ge=1)
    priority: int | None = Field(default=None, ge=-PRIORITY_LIMIT, le=PRIORITY_LIMIT)
    max_priority: int | None = Field(default=None, ge=-PRIORITY_LIMIT, le=PRIORITY_LIMIT)
    expires_at: datetime | None = None


class RotateBody(BaseModel):
    """Body of ``POST /admin/keys/{id}/rotate``."""

    model_config = ConfigDict(extra="forbid")

    overlap_s: float = Field(default=0.0, ge=0, le=30 * 86400)


def _error(exc: ServehallError) -> JSONResponse:
    return JSONResponse(exc.envelope(), status_code=exc.status, headers=exc.headers)


def _admin(request: Request) -> Principal:
    principal = getattr(request.state, "principal", None)
    if not isinstance(principal, Principal):
        raise AuthenticationError()
    if not principal.has_scope(SCOPE_ADMIN):
        raise PermissionDeniedError(
            "This credential lacks the 'admin' scope.", code="insufficient_scope"
        )
    return principal


def _key_id(raw: str) -> str:
    return raw.removeprefix("sh-")


async def _json(request: Request) -> Any:
    body = await request.body()
    if not body:
        return {}
    try:
        return json.loads(body)
    except ValueError:
        raise InvalidRequestError("The body is not valid JSON.") from None


def _validate(model: type[BaseModel], data: Any) -> Any:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        first = exc.errors(include_input=False, include_url=False)[0]
        param = ".".join(str(p) for p in first["loc"]) or None
        raise InvalidRequestError(f"Invalid body: {param}: {first['msg']}", param=param) from None


def _key_details(rec: KeyRecord) -> dict[str, Any]:
    d = rec.as_dict()
    return {k: d[k] for k in AUDITED_KEY_FIELDS}


Handler = Callable[[Request], Awaitable[JSONResponse]]


def build_routes(runtime_of: Any) -> list[Route]:
    """The ``/admin/keys`` routes; ``runtime_of(request)`` returns the :class:`AuthRuntime`."""

    def rt(request: Request) -> AuthRuntime:
        r: AuthRuntime = runtime_of(request)
        if r.keys is None:
            raise InvalidRequestError("API keys are disabled ([auth] api_keys = false).")
        return r

    async def list_keys(request: Request) -> JSONResponse:
        who = _admin(request)
        r = rt(request)
        tenant = request.query_params.get("tenant")
        include = request.query_params.get("all", "").lower() in ("1", "true", "yes")
        assert r.keys is not None
        recs = await r.keys.list(tenant=tenant, include_revoked=include)
        r.audit(
            AuditEvent(
                action="key.listed",
                actor=who.id,
                details={"tenant": tenant, "include_revoked": include, "count": len(recs)},
            )
        )
        now = utcnow()
        return JSONResponse({"object": "list", "data": [x.as_dict(now) for x in recs]})

    async def create_key(request: Request) -> JSONResponse:
        who = _admin(request)
        r = rt(request)
        body: CreateKeyBody = _validate(CreateKeyBody, await _json(request))
        assert r.keys is not None
        rec, key = await r.keys.create(
            tenant=body.tenant,
            name=body.name,
            scopes=body.scopes,
            models=body.models,
            rpm=body.rpm,
            tpm=body.tpm,
            expires_at=body.expires_at,
            created_by=who.id,
            priority=body.priority,
            max_priority=body.max_priority,
        )
        r.audit(
            AuditEvent(
                action="key.created",
                actor=who.id,
                target=rec.public_id,
                details=_key_details(rec),
            )
        )
        return JSONResponse({**rec.as_dict(), "key": key}, status_code=201)

    def one_key(action: str, op: Callable[[KeyStore, str], Awaitable[KeyRecord]]) -> Handler:
        """A handler that applies ``op`` to the path's key, audits ``action``, returns it."""

        async def handler(request: Request) -> JSONResponse:
            who = _admin(request)
            r = rt(request)
            assert r.keys is not None
            rec = await op(r.keys, _key_id(request.path_params["key_id"]))
            r.audit(AuditEvent(action=action, actor=who.id, target=rec.public_id))
            return JSONResponse(rec.as_dict())

        return handler

    get_key = one_key("key.viewed", KeyStore.get)
    revoke_key = one_key("key.revoked", KeyStore.revoke)

    async def rotate_key(request: Request) -> JSONResponse:
        who = _admin(request)
        r = rt(request)
        body: RotateBody = _validate(RotateBody, await _json(request))
        assert r.keys is not None
        try:
            rec, key = await r.keys.rotate(
                _key_id(request.path_params["key_id"]), timedelta(seconds=body.overlap_s)
            )
        except ValueError as exc:
            raise InvalidRequestError(str(exc)) from None
        r.audit(
            AuditEvent(
                action="key.rotated",
                actor=who.id,
                target=rec.public_id,
                details={"overlap_s": body.overlap_s},
            )
        )
        return JSONResponse({**rec.as_dict(), "key": key})

    return [
        Route("/admin/keys", _guard(list_keys), methods=["GET"]),
        Route("/admin/keys", _guard(create_key), methods=["POST"]),
        Route("/admin/keys/{key_id}", _guard(get_key), methods=["GET"]),
        Route("/admin/keys/{key_id}", _guard(revoke_key), methods=["DELETE"]),
        Route("/admin/keys/{key_id}/revoke", _guard(revoke_key), methods=["POST"]),
        Route("/admin/keys/{key_id}/rotate", _guard(rotate_key), methods=["POST"]),
    ]


def _guard(handler: Handler) -> Handler:
    """Turn the handler's errors into OpenAI envelopes: its :class:`ServehallError`
    as is, an unknown key as 404 ``key_not_found``, and 503 (not 500) when the key
    store's database cannot be reached."""

    @functools.wraps(handler)
    async def guarded(request: Request) -> JSONResponse:
        try:
            return await handler(request)
        except KeyNotFoundError:
            return _error(_not_found())
        except ServehallError as exc:
            return _error(exc)
        except (SQLAlchemyError, OSError) as exc:
            log.warning("admin key operation failed: %s", type(exc).__name__)
            return _error(
                ServiceUnavailableError(
                    "The key store is temporarily unavailable; retry later.",
                    code="auth_unavailable",
                    headers={"Retry-After": "1"},
                )
            )

    return guarded


def _not_found() -> ServehallError:
    return NotFoundError("No API key with that id.", code="key_not_found")
