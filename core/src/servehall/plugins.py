"""The plugin host: loads entry points of group ``servehall`` through pluggy.

Only entry points named in ``[plugins] enabled`` are loaded, plus the core's default
plugins (:data:`DEFAULT_PLUGINS`), which register through the same hooks as third-party
ones (datasette's ``plugins.py`` model). A plugin that fails to import is recorded with
its reason instead of crashing the host; :meth:`PluginHost.check_enabled` refuses to
serve when an *enabled* plugin failed. A plugin module may declare
``SERVEHALL_HOOK_API = ">=1,<2"``-style compatibility as a ``(min, max_exclusive)``
tuple of major versions; the host refuses one it cannot serve.

Core code calls hooks only through the typed methods of :class:`PluginHost` (tox 4's
facade idea), never through untyped ``pm.hook.*`` at call sites. Hooks run in *chain
order*: the core's default plugins first, then enabled plugins in the order of
``[plugins] enabled`` (so ``enabled = ["auth", "ldap"]`` asks ``auth`` first).
"""

from __future__ import annotations

import importlib
import inspect
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from importlib.metadata import EntryPoint, entry_points
from types import ModuleType
from typing import TYPE_CHECKING, Any, cast

import pluggy

from servehall import hookspecs
from servehall.backends import BackendRegistry
from servehall.errors import PluginError
from servehall.registries import SchedulerRegistry, SinkRegistry
from servehall.version import HOOK_API_VERSION

if TYPE_CHECKING:
    import typer
    from pydantic import BaseModel
    from starlette.requests import Request

    from servehall.config.settings import Settings
    from servehall.filters import InputFilter, OutputStreamFilter
    from servehall.host import Host
    from servehall.principal import Principal
    from servehall.routes import RouteRegistry
    from servehall.usage import AdmissionRequest, Reservation

log = logging.getLogger("servehall.plugins")

ENTRY_POINT_GROUP = "servehall"

DEFAULT_PLUGINS: tuple[str, ...] = (
    "servehall.defaults.schedulers",
    "servehall.defaults.commands",
    "servehall.defaults.cpu_backend",
    "servehall.defaults.null_backend",
    "servehall.defaults.sinks",
    "servehall.defaults.records_commands",
)
"""Core modules registered as plugins on every host, before any entry point."""


@dataclass(slots=True)
class PluginInfo:
    """What ``servehall plugins`` shows about one plugin."""

    name: str
    module: str
    distribution: str | None = None
    version: str | None = None
    enabled: bool = False
    default: bool = False
    loaded: bool = False
    error: str | None = None
    hooks: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "module": self.module,
            "distribution": self.distribution,
            "version": self.version,
            "enabled": self.enabled,
            "default": self.default,
            "loaded": self.loaded,
            "error": self.error,
            "hooks": self.hooks,
        }


def _check_api(module: ModuleType) -> None:
    wanted = getattr(module, "SERVEHALL_HOOK_API", None)
    if wanted is None:
        return
    lo, hi = wanted
    major = int(HOOK_API_VERSION.split(".")[0])
    if not (lo <= major < hi):
        raise PluginError(
            f"plugin needs hook API major version in [{lo}, {hi}), "
            f"this servehall provides {HOOK_API_VERSION}"
        )


def installed_entry_points() -> dict[str, EntryPoint]:
    """Entry points of group ``servehall`` by name."""
    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}


class PluginHost:
    """A pluggy manager with the core's hookspecs, plus typed hook calls.

    Args:
        enabled: entry-point names to load (``[plugins] enabled``).
        load_all: load every installed entry point (``servehall plugins`` uses this
            to report import errors and hooks even for disabled plugins).
        extra: already-imported plugin objects to register (tests, embedding).

    Raises:
        PluginError: an enabled name is not installed (the message lists installed names).
    """

    def __init__(
        self,
        enabled: Iterable[str] = (),
        *,
        load_all: bool = False,
        extra: Iterable[tuple[str, object]] = (),
    ) -> None:
        self.pm = pluggy.PluginManager("servehall")
        self.pm.add_hookspecs(hookspecs)
        self.enabled = list(dict.fromkeys(enabled))
        self.infos: dict[str, PluginInfo] = {}
        installed = installed_entry_points()
        unknown = [n for n in self.enabled if n not in installed]
        if unknown:
            names = ", ".join(sorted(installed)) or "none"
            raise PluginError(
                f"unknown plugin(s) in [plugins] enabled: {', '.join(unknown)}; "
                f"installed plugins: {names}"
            )
        for mod in DEFAULT_PLUGINS:
            module = importlib.import_module(mod)
            self._register(mod.rsplit(".", 1)[-1], module, mod, default=True)
        # enabled plugins first, in config order (= hook call order), then the others
        order = [*self.enabled, *sorted(set(installed) - set(self.enabled))]
        for name in order:
            ep = installed[name]
            dist = ep.dist
            info = PluginInfo(
                name=name,
                module=ep.value,
                distribution=dist.name if dist else None,
                version=dist.version if dist else None,
                enabled=name in self.enabled,
            )
            self.infos[name] = info
            if not (info.enabled or load_all):
                continue
            try:
                module = ep.load()
                _check_api(module)
            except Exception as exc:  # a broken plugin must not crash the host
                info.error = f"{type(exc).__name__}: {exc}"
                log.warning("plugin %s failed to load: %s", name, info.error)
                continue
            if info.enabled:
                self._register(name, module, ep.value, info=info)
            else:
                info.hooks = self._hooks_of(module)
        for name, obj in extra:
            self._register(name, obj, getattr(obj, "__name__", name), enabled=True)

    @staticmethod
    def _hooks_of(obj: object) -> list[str]:
        return sorted(
            n for n in dir(obj) if n.startswith("servehall_") and callable(getattr(obj, n))
        )

    def _register(
        self,
        name: str,
        obj: object,
        module: str,
        *,
        default: bool = False,
        enabled: bool = True,
        info: PluginInfo | None = None,
    ) -> None:
        info = info or PluginInfo(name=name, module=module, default=default, enabled=enabled)
        if default:
            info.name = f"servehall.{name}"
        self.pm.register(obj, name=info.name)
        info.loaded = True
        info.hooks = self._hooks_of(obj)
        self.infos[info.name] = info

    def check_enabled(self) -> None:
        """Raise PluginError when an enabled plugin failed to load (``serve`` refuses)."""
        bad = [i for i in self.infos.values() if i.enabled and i.error]
        if bad:
            detail = "; ".join(f"{i.name}: {i.error}" for i in bad)
            raise PluginError(f"enabled plugin(s) failed to load — {detail}")

    def describe(self) -> list[dict[str, Any]]:
        """Every known plugin as a dict, for ``servehall plugins --json``."""
        return [self.infos[k].as_dict() for k in sorted(self.infos)]

    def _owner(self, impl: Any) -> str:
        return str(impl.plugin_name)

    @staticmethod
    def _each(hook: Any, **kwargs: Any) -> list[Any]:
        """Call a synchronous hook's implementations in chain order; their results."""
        return [impl.function(**kwargs) for impl in hook.get_hookimpls()]

    # --- typed hook calls -------------------------------------------------------------

    def backends(self) -> BackendRegistry:
        """Collect every backend (``servehall_register_backends``)."""
        registry = BackendRegistry()
        for impl in self.pm.hook.servehall_register_backends.get_hookimpls():
            registry._current_owner = self._owner(impl)
            impl.function(registry=registry)
        return registry

    def schedulers(self) -> SchedulerRegistry:
        """Collect scheduling policies (``servehall_register_schedulers``)."""
        registry = SchedulerRegistry()
        self._each(self.pm.hook.servehall_register_schedulers, registry=registry)
        return registry

    def sinks(self) -> SinkRegistry:
        """Collect record sink kinds (``servehall_register_sinks``)."""
        registry = SinkRegistry()
        self._each(self.pm.hook.servehall_register_sinks, registry=registry)
        return registry

    def settings_models(self) -> dict[str, type[BaseModel]]:
        """``{section: model}`` from ``servehall_settings_models``; PluginError on clashes."""
        out: dict[str, type[BaseModel]] = {}
        for result in self._each(self.pm.hook.servehall_settings_models):
            for section, model in result or []:
                if section in out:
                    raise PluginError(f"config section {section!r} claimed by two plugins")
                out[section] = model
        return out

    @property
    def has_authenticators(self) -> bool:
        """True when some plugin implements ``servehall_authenticate``."""
        return bool(self.pm.hook.servehall_authenticate.get_hookimpls())

    async def authenticate(self, request: Request, settings: Settings) -> Principal | None:
        """First principal from ``servehall_authenticate``, awaiting in chain order.

        AuthenticationError from a plugin propagates (401)."""
        for impl in self.pm.hook.servehall_authenticate.get_hookimpls():
            result = impl.function(request=request, settings=settings)
            if inspect.isawaitable(result):
                result = await result
            if result is not None:
                return cast("Principal", result)
        return None

    async def authorize(self, request: AdmissionRequest) -> list[Reservation]:
        """Run ``servehall_authorize`` in chain order; on an error, release what was reserved."""
        held: list[Reservation] = []
        try:
            for impl in self.pm.hook.servehall_authorize.get_hookimpls():
                result = impl.function(request=request)
                if inspect.isawaitable(result):
                    result = await result
                if result is not None:
                    held.append(cast("Reservation", result))
        except BaseException:
            for r in held:
                await r.release()
            raise
        return held

    def input_filters(self, settings: Settings) -> list[InputFilter]:
        """Input filters from every plugin, concatenated."""
        out: list[InputFilter] = []
        for result in self._each(self.pm.hook.servehall_input_filters, settings=settings):
            out.extend(result or [])
        return out

    @property
    def has_output_filters(self) -> bool:
        """True when some plugin implements ``servehall_output_filters``."""
        return bool(self.pm.hook.servehall_output_filters.get_hookimpls())

    def output_filters(
        self, request: AdmissionRequest, principal: Principal
    ) -> list[OutputStreamFilter]:
        """Fresh per-choice stream filters from every plugin, concatenated."""
        out: list[OutputStreamFilter] = []
        hook = self.pm.hook.servehall_output_filters
        for result in self._each(hook, request=request, principal=principal):
            out.extend(result or [])
        return out

    async def _call_async(self, hook: Any, **kwargs: Any) -> None:
        for impl in hook.get_hookimpls():
            result = impl.function(**kwargs)
            if inspect.isawaitable(result):
                await result

    async def startup(self, host: Host) -> None:
        """Run ``servehall_startup`` hooks in order, awaiting async ones."""
        await self._call_async(self.pm.hook.servehall_startup, host=host)

    async def shutdown(self, host: Host) -> None:
        """Run ``servehall_shutdown`` hooks in order, awaiting async ones."""
        await self._call_async(self.pm.hook.servehall_shutdown, host=host)

    def routes(self, router: RouteRegistry) -> None:
        """Let plugins add routes."""
        self._each(self.pm.hook.servehall_register_routes, router=router)

    def commands(self, cli: typer.Typer) -> None:
        """Let plugins add CLI commands."""
        self._each(self.pm.hook.servehall_register_commands, cli=cli)
