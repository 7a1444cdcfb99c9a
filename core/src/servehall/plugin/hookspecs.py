"""The hook contract between the servehall host and its plugins (``HOOK_API_VERSION`` 2.0).

Conventions (after pytest's ``hookspec.py`` and datasette's ``hookspecs.py``):

* every hook is prefixed ``servehall_``; a plugin implements any subset, and an
  implementation may declare only the arguments it uses (pluggy passes those);
* all hooks are *collect-all* (every implementation runs, results gathered in a list in
  chain order); none is firstresult and none is called per token;
* registration hooks receive a typed registry and return nothing;
* hooks that need state receive ``host``: the running :class:`~servehall.plugin.host.Host`, whose
  ``host.state`` keeps each plugin's state by type (no module globals);
* ``request`` always means the HTTP request (``starlette.requests.Request``); the parsed,
  tokenized inference request is ``admission``
  (:class:`~servehall.admission.usage.AdmissionRequest`);
* async hooks return awaitables which the host awaits **in chain order** — that is why
  ``servehall_authenticate`` is collect-all: an async firstresult hook would stop at the
  first coroutine object.

Plugins mark implementations with :data:`servehall.hookimpl` (``tryfirst``, ``trylast``,
``wrapper`` and ``hookwrapper`` work as pluggy documents). Changes from 1.0:
``servehall_authenticate(host, request)`` (was ``request, settings``),
``servehall_authorize(host, admission)`` (was ``request``),
``servehall_input_filters(host)`` (was ``settings``),
``servehall_output_filters(host, admission)`` (was ``request, principal``),
``servehall_register_routes(host, router)``, and the new ``servehall_migrations``.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:
    import typer
    from pydantic import BaseModel
    from starlette.requests import Request

    from servehall.admission.filters import InputFilter, OutputStreamFilter
    from servehall.admission.principal import Principal
    from servehall.admission.usage import AdmissionRequest, Reservation
    from servehall.engines.backends import BackendRegistry
    from servehall.plugin.host import Host
    from servehall.plugin.migrations import MigrationBranch
    from servehall.plugin.registries import (
        RouteRegistry,
        SchedulerRegistry,
        SinkRegistry,
        ToolParserRegistry,
    )

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
def servehall_register_tool_parsers(registry: ToolParserRegistry) -> None:
    """Add tool-call formats: ``registry.add(ToolParser(name, format, trigger, begin, end))``
    (:class:`servehall.ToolParser`; the core registers ``hermes`` and ``llama3_json``).

    Called once at startup; ``[[models]] tool_parser`` picks one per model by name (an
    unknown name stops the start with a ConfigError listing the known ones). Collect-all.
    """


@hookspec
def servehall_authenticate(
    host: Host, request: Request
) -> Principal | Awaitable[Principal | None] | None:
    """Identify the caller of an HTTP request (any route outside the auth allow-list).

    Return a :class:`~servehall.admission.principal.Principal` (with its typed
    :class:`~servehall.admission.principal.Policy`), ``None`` when this plugin does not recognise
    the credential, or an awaitable of either. Raise
    :class:`~servehall.errors.AuthenticationError` for a credential that is present but
    bad. Collect-all, awaited in chain order; the first principal wins and later
    implementations' coroutines are closed unawaited. When at least one plugin
    implements this hook and none returns a principal, the host answers 401.
    """


@hookspec
def servehall_authorize(
    host: Host, admission: AdmissionRequest
) -> Reservation | Awaitable[Reservation | None] | None:
    """Reserve quota for a parsed inference request (step 3, after the core's own access
    check: scope and model allow-list, :func:`servehall.admission.access.check_model_access`).

    Called once per inference request after validation and tokenization, with the
    principal, model and token estimate (``prompt_tokens + max_tokens × n``). Raise
    :class:`~servehall.errors.PermissionDeniedError` (403) or
    :class:`~servehall.errors.RateLimitError` (429 with ``Retry-After``). Return a
    :class:`~servehall.admission.usage.Reservation` to be settled with the real usage when the
    request ends (or released when it is rejected later), or None. Collect-all, awaited
    in chain order; when one raises, the reservations already made are released.
    """


@hookspec
def servehall_input_filters(host: Host) -> list[InputFilter] | None:
    """Return input filters (run on the whole prompt before tokenization).

    Called once at startup, before ``servehall_startup``; filters are reused across
    requests. Collect-all; lists are concatenated in chain order.
    """


@hookspec
def servehall_output_filters(
    host: Host, admission: AdmissionRequest
) -> list[OutputStreamFilter] | None:
    """Return fresh per-request stream filters for one choice's output
    (``admission.principal`` is the caller).

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
def servehall_register_routes(host: Host, router: RouteRegistry) -> None:
    """Add HTTP routes: ``router.add(Route(...))``. Every route is authenticated unless
    its path is in ``[server] auth_allow_paths``. Called once when the app is built;
    handlers reach the host as ``request.app.state.api.host``."""


@hookspec
def servehall_migrations() -> list[MigrationBranch] | None:
    """Declare the Alembic branch(es) of this plugin's tables (shipped in its package).

    Return ``[MigrationBranch(label, location)]`` where ``label`` is the plugin's
    entry-point name and ``location`` the directory of its revision files (a path or
    ``"package:subdir"``). ``servehall db upgrade``, ``db status`` and
    ``[database] auto_migrate`` apply the branches of enabled plugins only; disabling a
    plugin never drops its tables. Called when the schema is checked. Collect-all.
    """


@hookspec
def servehall_register_commands(cli: typer.Typer) -> None:
    """Add CLI commands or sub-apps to ``servehall``. Called once when the CLI starts."""


HOOK_NAMES: tuple[str, ...] = tuple(
    name for name in list(globals()) if name.startswith("servehall_")
)
"""Names of every hook in this contract."""
