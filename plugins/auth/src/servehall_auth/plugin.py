"""Entry point ``auth`` (group ``servehall``): the auth plugin's hook implementations.

Import-light: the database, JWT and HTTP-route modules load when the host starts, not
when the plugin is discovered.

* ``servehall_settings_models`` — the ``[auth]`` section (:class:`AuthSettings`);
* ``servehall_startup`` / ``servehall_shutdown`` — open/close the :class:`AuthRuntime`
  (key store on the deployment database, JWT keys, in-process rate limiter);
* ``servehall_authenticate`` — ``Authorization: Bearer`` / ``x-api-key`` → principal;
* ``servehall_authorize`` — ``inference`` scope, model allow-list, token-aware limits;
* ``servehall_register_routes`` — ``/admin/keys`` (``admin`` scope);
* ``servehall_register_commands`` — ``servehall keys create|list|revoke|rotate``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from servehall import (
    AdmissionRequest,
    Host,
    Principal,
    Reservation,
    RouteRegistry,
    ServiceUnavailableError,
    Settings,
    hookimpl,
)
from servehall_auth.settings import AuthSettings

if TYPE_CHECKING:
    import typer
    from pydantic import BaseModel
    from starlette.requests import Request

    from servehall_auth.runtime import AuthRuntime

SERVEHALL_HOOK_API = (1, 2)
STATE_KEY = "auth"

_current: AuthRuntime | None = None


def runtime_for(request: Any = None) -> AuthRuntime:
    """The runtime of the host serving ``request`` (or of this process).

    Raises:
        ServiceUnavailableError: the host has not started the plugin (fail closed).
    """
    state = getattr(getattr(request, "app", None), "state", None)
    host = getattr(state, "host", None) or getattr(getattr(state, "api", None), "host", None)
    rt = host.state.get(STATE_KEY) if isinstance(host, Host) else None
    rt = rt or _current
    if rt is None:
        raise ServiceUnavailableError("Authentication is not ready yet.")
    return rt


@hookimpl
def servehall_settings_models() -> list[tuple[str, type[BaseModel]]]:
    """The ``[auth]`` section."""
    return [("auth", AuthSettings)]


@hookimpl
async def servehall_startup(host: Host) -> None:
    """Start the runtime; audit events go to ``host.records``."""
    global _current
    from servehall_auth.runtime import AuthRuntime

    section = host.settings.section("auth")
    settings = (
        section if isinstance(section, AuthSettings) else AuthSettings.model_validate(section or {})
    )

    def audit(event: Any) -> None:
        if host.records is not None:
            host.records.audit(event)

    from servehall_auth.redaction import install

    undo = install([settings.pepper.get_secret_value()] if settings.pepper else [])
    try:
        rt = await AuthRuntime.start(settings, host.settings.database.url.get_secret_value(), audit)
    except BaseException:
        undo()
        raise
    rt.on_close(undo)
    host.state[STATE_KEY] = rt
    _current = rt


@hookimpl
async def servehall_shutdown(host: Host) -> None:
    """Close the runtime's database pool."""
    global _current
    rt = host.state.pop(STATE_KEY, None)
    if rt is not None:
        await rt.close()
        if _current is rt:
            _current = None


@hookimpl
async def servehall_authenticate(request: Request, settings: Settings) -> Principal | None:
    """API key or JWT from the request headers (see :mod:`servehall_auth.headers`)."""
    rt = runtime_for(request)
    client = request.client.host if request.client else None
    return await rt.authenticate(
        request.headers.getlist("authorization"),
        request.headers.getlist("x-api-key"),
        path=request.url.path,
        client=client,
    )


@hookimpl
async def servehall_authorize(request: AdmissionRequest) -> Reservation | None:
    """Scope, model allow-list and rate limits (see :meth:`AuthRuntime.authorize`)."""
    return await runtime_for().authorize(request)


@hookimpl
def servehall_register_routes(router: RouteRegistry) -> None:
    """``/admin/keys`` routes."""
    from servehall_auth.admin_api import build_routes

    for route in build_routes(runtime_for):
        router.add(route)


@hookimpl
def servehall_register_commands(cli: typer.Typer) -> None:
    """``servehall keys …``."""
    from servehall_auth.cli import keys_app

    cli.add_typer(keys_app, name="keys")
