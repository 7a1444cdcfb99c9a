"""Entry point ``auth`` (group ``servehall``): the auth plugin's hook implementations.

Import-light: the database, JWT and HTTP-route modules load when the host starts, not
when the plugin is discovered.

* ``servehall_settings_models`` — the ``[auth]`` section (:class:`AuthSettings`);
* ``servehall_migrations`` — the ``api_key`` table (branch ``auth``, shipped in
  ``servehall_auth/migrations``);
* ``servehall_startup`` / ``servehall_shutdown`` — open/close the :class:`AuthRuntime`
  (key store on the deployment database, JWT keys, in-process rate limiter), kept on
  ``host.state`` (no module globals);
* ``servehall_authenticate`` — ``Authorization: Bearer`` / ``x-api-key`` → principal
  with its tenant's policy (``store_prompts``, ``hide_forbidden_models``);
* ``servehall_authorize`` — token-aware limits (the core checks scope and models);
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
    hookimpl,
)
from servehall_auth.settings import AuthSettings

if TYPE_CHECKING:
    import typer
    from pydantic import BaseModel
    from starlette.requests import Request

    from servehall_auth.runtime import AuthRuntime

SERVEHALL_HOOK_API = "2"


def _runtime_class() -> type[AuthRuntime]:
    from servehall_auth.runtime import AuthRuntime

    return AuthRuntime


def runtime_of(host: Host) -> AuthRuntime:
    """The :class:`AuthRuntime` this plugin keeps on ``host.state``.

    Raises:
        ServiceUnavailableError: the host has not started the plugin (fail closed, 503).
    """
    rt = host.state.get(_runtime_class())
    if rt is None:
        raise ServiceUnavailableError("Authentication is not ready yet.")
    return rt


def runtime_for_request(request: Any) -> AuthRuntime:
    """The runtime of the host serving an HTTP ``request`` (admin routes)."""
    api = getattr(getattr(getattr(request, "app", None), "state", None), "api", None)
    host = getattr(api, "host", None)
    if not isinstance(host, Host):
        raise ServiceUnavailableError("Authentication is not ready yet.")
    return runtime_of(host)


@hookimpl
def servehall_settings_models() -> list[tuple[str, type[BaseModel]]]:
    """The ``[auth]`` section."""
    return [("auth", AuthSettings)]


@hookimpl
def servehall_migrations() -> list[Any]:
    """The ``api_key`` table: branch ``auth`` in ``servehall_auth/migrations``."""
    from servehall import MigrationBranch

    def metadata() -> Any:
        from servehall_auth.store import auth_metadata

        return auth_metadata()

    return [MigrationBranch("auth", "servehall_auth:migrations/versions", metadata)]


@hookimpl
async def servehall_startup(host: Host) -> None:
    """Start the runtime on ``host.state``; audit events go to ``host.records``; the key
    store runs under the ``[database]`` timeouts."""
    from servehall import DbTimeouts
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
        rt = await AuthRuntime.start(
            settings,
            host.settings.database.url.get_secret_value(),
            audit,
            DbTimeouts.of(host.settings),
        )
    except BaseException:
        undo()
        raise
    rt.on_close(undo)
    host.state.put(rt)


@hookimpl
async def servehall_shutdown(host: Host) -> None:
    """Close the runtime's database pool."""
    rt = host.state.pop(_runtime_class())
    if rt is not None:
        await rt.close()


@hookimpl
async def servehall_authenticate(host: Host, request: Request) -> Principal | None:
    """API key or JWT from the request headers (see :mod:`servehall_auth.headers`)."""
    rt = runtime_of(host)
    client = request.client.host if request.client else None
    return await rt.authenticate(
        request.headers.getlist("authorization"),
        request.headers.getlist("x-api-key"),
        path=request.url.path,
        client=client,
    )


@hookimpl
async def servehall_authorize(host: Host, admission: AdmissionRequest) -> Reservation | None:
    """Token-aware rate limits (see :meth:`AuthRuntime.authorize`)."""
    return await runtime_of(host).authorize(admission)


@hookimpl
def servehall_register_routes(router: RouteRegistry) -> None:
    """``/admin/keys`` routes."""
    from servehall_auth.admin_api import build_routes

    for route in build_routes(runtime_for_request):
        router.add(route)


@hookimpl
def servehall_register_commands(cli: typer.Typer) -> None:
    """``servehall keys …``."""
    from servehall_auth.cli import keys_app

    cli.add_typer(keys_app, name="keys")
