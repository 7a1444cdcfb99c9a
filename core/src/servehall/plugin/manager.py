"""The plugin host: loads entry points of group ``servehall`` into a pluggy manager.

Only entry points named in ``[plugins] enabled`` are loaded, plus the core's default
plugins (:data:`DEFAULT_PLUGINS`), which register through the same hooks as third-party
ones (datasette's ``plugins.py`` model). Every hook is called through pluggy itself
(``pm.hook.<name>(...)``), so pluggy's documented semantics hold for plugin authors:
``tryfirst``/``trylast``, ``wrapper``/``hookwrapper`` implementations, implementations
that declare only some of the hook's arguments, and :meth:`pluggy.PluginManager.check_pending`
refusing an implementation of a hook that does not exist.

Chain order (the order pluggy calls implementations of one hook): the core's default
plugins, then the enabled plugins in the order of ``[plugins] enabled`` (so
``enabled = ["auth", "ldap"]`` asks ``auth`` first), then objects passed as ``extra``;
``tryfirst``/``trylast`` move an implementation to the front/back of that order, and
wrappers run around all of them. (pluggy calls the *last registered* first, so the host
registers in reverse chain order.)

A plugin that cannot be served — its entry point fails to import, it declares a hook API
major version other than :data:`~servehall.version.HOOK_API_VERSION`'s, or it implements
an unknown hook or a hook with arguments the spec lacks — is recorded with a one-line
reason naming the plugin; :meth:`PluginHost.check_enabled` refuses to start with it
enabled (``servehall plugins`` still lists it).

Core code calls hooks only through the typed methods of :class:`PluginHost` (tox 4's
facade idea), never through untyped ``pm.hook.*`` at call sites.
"""

from __future__ import annotations

import importlib
import inspect
import logging
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from importlib.metadata import EntryPoint, entry_points
from typing import TYPE_CHECKING, Any, cast

import pluggy

from servehall.engines.backends import BackendRegistry
from servehall.errors import PluginError
from servehall.plugin import hookspecs
from servehall.plugin.registries import SchedulerRegistry, SinkRegistry, ToolParserRegistry
from servehall.version import HOOK_API_VERSION, check_hook_api

if TYPE_CHECKING:
    import typer
    from pydantic import BaseModel
    from starlette.requests import Request

    from servehall.admission.filters import InputFilter, OutputStreamFilter
    from servehall.admission.principal import Principal
    from servehall.admission.usage import AdmissionRequest, Reservation
    from servehall.plugin.host import Host
    from servehall.plugin.migrations import MigrationBranch
    from servehall.plugin.registries import RouteRegistry

log = logging.getLogger("servehall.plugins")

ENTRY_POINT_GROUP = "servehall"

DEFAULT_PLUGINS: tuple[str, ...] = (
    "servehall.defaults.schedulers",
    "servehall.defaults.commands",
    "servehall.defaults.cpu_backend",
    "servehall.defaults.null_backend",
    "servehall.defaults.sinks",
    "servehall.defaults.tool_parsers",
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
    hook_api: str | None = None

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
            "hook_api": self.hook_api,
        }


def installed_entry_points() -> dict[str, EntryPoint]:
    """Entry points of group ``servehall`` by name."""
    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}


def _hooks_of(obj: object) -> list[str]:
    return sorted(n for n in dir(obj) if n.startswith("servehall_") and callable(getattr(obj, n)))


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".strip().rstrip(":")


class PluginHost:
    """A pluggy manager with the core's hookspecs, plus typed hook calls.

    Args:
        enabled: entry-point names to load (``[plugins] enabled``), in chain order.
        load_all: also import installed entry points that are not enabled, to report
            their hooks and import errors (``servehall plugins``); they are not
            registered, so their hooks never run.
        extra: already-imported plugin objects to register after the enabled ones
            (tests, embedding).

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
        self._modules: dict[str, str] = {}  # module name -> plugin name (backend owners)
        installed = installed_entry_points()
        unknown = [n for n in self.enabled if n not in installed]
        if unknown:
            names = ", ".join(sorted(installed)) or "none"
            raise PluginError(
                f"unknown plugin(s) in [plugins] enabled: {', '.join(unknown)}; "
                f"installed plugins: {names}"
            )
        chain: list[tuple[PluginInfo, object]] = []
        for mod in DEFAULT_PLUGINS:
            info = PluginInfo(
                name=f"servehall.{mod.rsplit('.', 1)[-1]}", module=mod, default=True, enabled=True
            )
            chain.append((info, importlib.import_module(mod)))
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
                info.hook_api = check_hook_api(name, getattr(module, "SERVEHALL_HOOK_API", None))
            except Exception as exc:  # a broken plugin must not crash the host
                info.error = exc.message if isinstance(exc, PluginError) else _one_line(exc)
                log.info("plugin %s failed to load: %s", name, info.error)
                continue
            info.hooks = _hooks_of(module)
            if info.enabled:
                chain.append((info, module))
        for name, obj in extra:
            module_name = getattr(obj, "__name__", None) or type(obj).__module__
            chain.append((PluginInfo(name=name, module=module_name, enabled=True), obj))
        for info, obj in reversed(chain):  # pluggy calls the last registered first
            self._register(info, obj)
        self._check_pending()

    def _register(self, info: PluginInfo, obj: object) -> None:
        self.infos[info.name] = info
        info.hooks = _hooks_of(obj)
        try:
            self.pm.register(obj, name=info.name)
        except pluggy.PluginValidationError as exc:
            lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
            detail = lines[0] + (f" — {lines[-1]}" if len(lines) > 1 else "")
            info.error = f"plugin {info.name!r}: {detail}"
            log.info("plugin %s refused: %s", info.name, info.error)
            return
        info.loaded = True
        module = getattr(obj, "__name__", None) or type(obj).__module__
        self._modules[module] = info.name

    def _check_pending(self) -> None:
        """Unregister (and mark failed) plugins implementing hooks that do not exist."""
        for hook_name in dir(self.pm.hook):
            if not hook_name.startswith("servehall_"):
                continue
            caller = getattr(self.pm.hook, hook_name)
            if caller.has_spec():
                continue
            for impl in caller.get_hookimpls():
                if impl.optionalhook:
                    continue
                info = self.infos.get(impl.plugin_name)
                known = ", ".join(hookspecs.HOOK_NAMES)
                if info is not None and info.error is None:
                    info.error = (
                        f"plugin {impl.plugin_name!r} implements unknown hook {hook_name!r} "
                        f"(hook API {HOOK_API_VERSION}: {known})"
                    )
                    log.info("%s", info.error)
                if info is not None:
                    info.loaded = False
                self.pm.unregister(name=impl.plugin_name)
        self.pm.check_pending()  # nothing left: every implementation has a spec

    def _owner_of_module(self, module: str | None) -> str:
        """The plugin whose code lives in ``module`` (longest matching prefix), or "?"."""
        while module:
            if module in self._modules:
                return self._modules[module]
            module = module.rpartition(".")[0]
        return "?"

    def check_enabled(self) -> None:
        """Raise PluginError when an enabled plugin cannot be served (``serve`` and the
        database commands refuse; the host never starts half-configured).

        The message is one line per plugin: ``plugin 'x': <reason>``."""
        bad = [i for i in self.infos.values() if i.enabled and i.error]
        if bad:
            lines = [
                e if (e := i.error or "").startswith("plugin ") else f"plugin {i.name!r}: {e}"
                for i in bad
            ]
            raise PluginError("; ".join(lines))

    def describe(self) -> list[dict[str, Any]]:
        """Every known plugin as a dict, for ``servehall plugins --json``."""
        return [self.infos[k].as_dict() for k in sorted(self.infos)]

    # --- typed hook calls -------------------------------------------------------------

    def backends(self) -> BackendRegistry:
        """Collect every backend (``servehall_register_backends``); each spec's owner is
        the plugin whose module called ``registry.add``."""
        registry = BackendRegistry(owner_of=self._owner_of_caller)
        self.pm.hook.servehall_register_backends(registry=registry)
        return registry

    def _owner_of_caller(self, depth: int) -> str:
        frame = sys._getframe(depth + 1)
        return self._owner_of_module(frame.f_globals.get("__name__"))

    def schedulers(self) -> SchedulerRegistry:
        """Collect scheduling policies (``servehall_register_schedulers``)."""
        registry = SchedulerRegistry()
        self.pm.hook.servehall_register_schedulers(registry=registry)
        return registry

    def tool_parsers(self) -> ToolParserRegistry:
        """Collect tool-call parsers (``servehall_register_tool_parsers``)."""
        registry = ToolParserRegistry()
        self.pm.hook.servehall_register_tool_parsers(registry=registry)
        return registry

    def sinks(self) -> SinkRegistry:
        """Collect record sink kinds (``servehall_register_sinks``)."""
        registry = SinkRegistry()
        self.pm.hook.servehall_register_sinks(registry=registry)
        return registry

    def settings_models(self) -> dict[str, type[BaseModel]]:
        """``{section: model}`` from ``servehall_settings_models``; PluginError on clashes."""
        out: dict[str, type[BaseModel]] = {}
        for result in self.pm.hook.servehall_settings_models():
            for section, model in result or []:
                if section in out:
                    raise PluginError(f"config section {section!r} claimed by two plugins")
                out[section] = model
        return out

    def migrations(self) -> list[MigrationBranch]:
        """The Alembic branches of the enabled plugins (``servehall_migrations``).

        Raises:
            PluginError: a plugin implements the hook but returns no branch labelled with
                its name (one line naming the plugin).
        """
        out: list[MigrationBranch] = []
        for result in self.pm.hook.servehall_migrations():
            out.extend(result or [])
        labels = {b.label for b in out}
        for impl in self.pm.hook.servehall_migrations.get_hookimpls():
            info = self.infos.get(impl.plugin_name)
            if info is not None and not info.default and impl.plugin_name not in labels:
                raise PluginError(
                    f"plugin {impl.plugin_name!r}: servehall_migrations returned no branch "
                    f"labelled {impl.plugin_name!r}"
                )
        return out

    def other_migrations(self) -> list[MigrationBranch]:
        """Branches of installed plugins that are *not* enabled here.

        Used only to read revisions such a plugin applied while it was enabled (its tables
        stay; nothing is upgraded or dropped). Each plugin is imported into a throwaway
        plugin manager, so none of its other hooks runs; one that fails is skipped."""
        out: list[MigrationBranch] = []
        for name, ep in sorted(installed_entry_points().items()):
            if name in self.enabled:
                continue
            try:
                pm = pluggy.PluginManager("servehall")
                pm.add_hookspecs(hookspecs)
                pm.register(ep.load(), name=name)
                for result in pm.hook.servehall_migrations():
                    out.extend(result or [])
            except Exception as exc:  # a disabled plugin must not break migrations
                log.debug("migrations of disabled plugin %s skipped: %s", name, exc)
        return out

    @property
    def has_authenticators(self) -> bool:
        """True when some plugin implements ``servehall_authenticate``."""
        return bool(self.pm.hook.servehall_authenticate.get_hookimpls())

    async def authenticate(self, host: Host, request: Request) -> Principal | None:
        """First principal from ``servehall_authenticate``, awaiting results in chain order.

        Coroutines after the winning one are closed unawaited (their plugin's code does
        not run). AuthenticationError from a plugin propagates (401)."""
        results = list(self.pm.hook.servehall_authenticate(host=host, request=request))
        try:
            while results:
                result = results.pop(0)
                if inspect.isawaitable(result):
                    result = await result
                if result is not None:
                    return cast("Principal", result)
            return None
        finally:
            _close_unawaited(results)

    async def authorize(self, host: Host, admission: AdmissionRequest) -> list[Reservation]:
        """Run ``servehall_authorize`` in chain order; on an error, release what was reserved."""
        results = list(self.pm.hook.servehall_authorize(host=host, admission=admission))
        held: list[Reservation] = []
        try:
            while results:
                result = results.pop(0)
                if inspect.isawaitable(result):
                    result = await result
                if result is not None:
                    held.append(cast("Reservation", result))
        except BaseException:
            _close_unawaited(results)
            for r in held:
                await r.release()
            raise
        return held

    def input_filters(self, host: Host) -> list[InputFilter]:
        """Input filters from every plugin, concatenated in chain order."""
        out: list[InputFilter] = []
        for result in self.pm.hook.servehall_input_filters(host=host):
            out.extend(result or [])
        return out

    @property
    def has_output_filters(self) -> bool:
        """True when some plugin implements ``servehall_output_filters``."""
        return bool(self.pm.hook.servehall_output_filters.get_hookimpls())

    def output_filters(self, host: Host, admission: AdmissionRequest) -> list[OutputStreamFilter]:
        """Fresh per-choice stream filters from every plugin, concatenated."""
        out: list[OutputStreamFilter] = []
        for result in self.pm.hook.servehall_output_filters(host=host, admission=admission):
            out.extend(result or [])
        return out

    async def startup(self, host: Host) -> None:
        """Run ``servehall_startup`` hooks in chain order, awaiting async ones."""
        await _await_each(self.pm.hook.servehall_startup(host=host))

    async def shutdown(self, host: Host) -> None:
        """Run ``servehall_shutdown`` hooks in chain order, awaiting async ones."""
        await _await_each(self.pm.hook.servehall_shutdown(host=host))

    def routes(self, host: Host, router: RouteRegistry) -> None:
        """Let plugins add routes."""
        self.pm.hook.servehall_register_routes(host=host, router=router)

    def commands(self, cli: typer.Typer) -> None:
        """Let plugins add CLI commands."""
        self.pm.hook.servehall_register_commands(cli=cli)


async def _await_each(results: list[Any]) -> None:
    results = list(results)
    try:
        while results:
            result = results.pop(0)
            if inspect.isawaitable(result):
                await result
    finally:
        _close_unawaited(results)


def _close_unawaited(results: list[Any]) -> None:
    for r in results:
        close = getattr(r, "close", None)
        if inspect.iscoroutine(r) and close is not None:
            close()
