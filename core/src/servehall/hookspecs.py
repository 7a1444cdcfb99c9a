"""The hook contract between the servehall host and its plugins (``HOOK_API_VERSION``).

Conventions (after pytest's ``hookspec.py`` and datasette's ``hookspecs.py``):

* every hook is prefixed ``servehall_``; a plugin implements any subset;
* all hooks are *collect-all* (every implementation runs, results gathered in a list)
  unless marked *firstresult*; none is called per token;
* registration hooks receive a typed registry and return nothing;
* async hooks return awaitables which the host awaits **in chain order** — that is why
  ``servehall_authenticate`` is collect-all: an async firstresult hook would stop at the
  first coroutine object.

Plugins mark implementations with :data:`servehall.hookimpl`.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:
    import typer
    from pydantic import BaseModel
    from starlette.requests import Request

    from servehall.backends import BackendRegistry
    from servehall.config.settings import Settings
    from servehall.filters import InputFilter, OutputStreamFilter
    from servehall.host import Host
    from servehall.principal import Principal
    from servehall.registries import SchedulerRegistry, SinkRegistry
    from servehall.routes import RouteRegistry
    from servehall.usage import AdmissionRequest, Reservation

hookspec = pluggy.HookspecMarker("servehall")


@hookspec
def servehall_register_backends(registry: BackendRegistry) -> None:
    """Add device backends: call ``registry.add(BackendSpec(name, probe, factory))``.

    Called once when the host starts (and by ``servehall plugins``). Collect-all.
    """


@hookspec
def servehall_register_schedulers(registry: SchedulerRegistry) -> None:
    """Add scheduling policies: ``registry.add(SchedulerSpec(name, factory))``.

    Called once at startup; the policy named in ``[scheduler] policy`` is used. Collect-all.
    """


@hookspec
def servehall_authenticate(
    request: Request, settings: Settings
) -> Principal | Awaitable[Principal | None] | None:
    """Identify the caller of an HTTP request (any route outside the auth allow-list).

    Return a :class:`~servehall.principal.Principal`, ``None`` when this plugin does not
    recognise the credential, or an awaitable of either. Raise
    :class:`~servehall.errors.AuthenticationError` for a credential that is present but
    bad. Collect-all, awaited in chain order; the first principal wins. When at least one
    plugin implements this hook and none returns a principal, the host answers 401.
    """


@hookspec
def servehall_authorize(
    request: AdmissionRequest,
) -> Reservation | Awaitable[Reservation | None] | None:
    """Authorize a parsed inference request and reserve quota (step 3).

    Called once per inference request after validation and tokenization, with the
    principal, model and token estimate (``prompt_tokens + max_tokens × n``). Raise
    :class:`~servehall.errors.PermissionDeniedError` (403) or
    :class:`~servehall.errors.RateLimitError` (429 with ``Retry-After``). Return a
    :class:`~servehall.usage.Reservation` to be settled with the real usage when the
    request ends (or released when it is rejected later), or None. Collect-all, awaited
    in chain order.
    """


@hookspec
def servehall_input_filters(settings: Settings) -> list[InputFilter] | None:
    """Return input filters (run on the whole prompt before tokenization).

    Called once at startup; filters are reused across requests. Collect-all; lists are
    concatenated in plugin order.
    """


@hookspec
def servehall_output_filters(
    request: AdmissionRequest, principal: Principal
) -> list[OutputStreamFilter] | None:
    """Return fresh per-request stream filters for one choice's output.

    Called once per choice of each inference request (never per token). Collect-all.
    """


@hookspec
def servehall_register_sinks(registry: SinkRegistry) -> None:
    """Add record sink kinds: ``registry.add(SinkSpec(name, factory))``.

    Called once at startup; ``[[sinks]]`` entries in config pick which run. Collect-all.
    """


@hookspec
def servehall_settings_models() -> list[tuple[str, type[BaseModel]]] | None:
    """Return ``[(section_name, PydanticModel)]`` for this plugin's config sections.

    Called when config is loaded; each ``[section]`` is validated by its model at startup
    and by ``servehall config check``. Collect-all.
    """


@hookspec
def servehall_startup(host: Host) -> Awaitable[None] | None:
    """The host started (engines loaded, database ready). May be async. Collect-all."""


@hookspec
def servehall_shutdown(host: Host) -> Awaitable[None] | None:
    """The host is stopping; release resources. May be async. Collect-all."""


@hookspec
def servehall_register_routes(router: RouteRegistry) -> None:
    """Add HTTP routes: ``router.add(Route(...))``. Every route is authenticated unless
    its path is in ``[server] auth_allow_paths``. Called once when the app is built."""


@hookspec
def servehall_register_commands(cli: typer.Typer) -> None:
    """Add CLI commands or sub-apps to ``servehall``. Called once when the CLI starts."""


HOOK_NAMES: tuple[str, ...] = tuple(
    name for name in list(globals()) if name.startswith("servehall_")
)
"""Names of every hook in this contract."""
