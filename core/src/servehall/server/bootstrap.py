"""Load a deployment: config file + enabled plugins + validated plugin sections."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from servehall.admission.scheduler import POLICY_SETTINGS, SchedulerSpec
from servehall.config.models import ModelConfig, check_versions
from servehall.config.settings import Settings, load_settings, validate_plugin_sections
from servehall.errors import ConfigError
from servehall.host.gate import check_gates
from servehall.plugin.manager import PluginHost


def load_deployment(
    config: Path | str | None = None, *, load_all: bool = False
) -> tuple[Settings, PluginHost]:
    """Read config, load the enabled plugins, and validate every plugin section and every
    name the config refers to (scheduler policy, sink kinds, model backends).

    Args:
        config: the config file (else ``$SERVEHALL_CONFIG``, else defaults).
        load_all: also import installed plugins that are not enabled (to report them);
            names are then not checked, so ``servehall plugins`` works on a bad config.

    Raises:
        ConfigError: the file, a section or a name is invalid (``errors`` lists every
            problem with its key path).
        PluginError: an enabled plugin is unknown, or cannot be served (fails to import,
            declares another hook API major version, implements an unknown hook): one
            line per plugin, naming it.
    """
    settings = load_settings(config)
    plugins = PluginHost(settings.plugins.enabled, load_all=load_all)
    if not load_all:
        plugins.check_enabled()  # never run half-configured
    validate_plugin_sections(settings, plugins.settings_models())
    if not load_all:
        check_names(settings, plugins)
    return settings, plugins


def check_names(
    settings: Settings,
    plugins: PluginHost,
    *,
    positions: Mapping[str, Sequence[int]] | None = None,
) -> None:
    """Check that the scheduler policy, sink kinds and model backends named in config are
    registered by the loaded plugins; ConfigError lists every unknown name with a hint.

    Args:
        positions: for ``config check``, which sets bad ``[[models]]``/``[[sinks]]``
            entries aside: per section, the index in the file of each entry kept
            (``positions["models"][i]`` for ``settings.models[i]``), so that errors name
            entries by their index in the file. None: the lists are as given.
    """

    def at(section: str, i: int) -> int:
        pos = (positions or {}).get(section)
        return pos[i] if pos is not None and i < len(pos) else i

    errs: list[tuple[str, str]] = []
    idle = sorted(i.name for i in plugins.infos.values() if not i.enabled and not i.default)
    hint = f" (installed but not enabled in [plugins] enabled: {', '.join(idle)})" if idle else ""
    schedulers = plugins.schedulers()
    policies = schedulers.names()
    if settings.scheduler.policy not in policies:
        errs.append(
            (
                "scheduler.policy",
                f"unknown policy {settings.scheduler.policy!r}; known: {', '.join(policies)}{hint}",
            )
        )
    else:
        errs.extend(check_scheduler_tenants(settings, schedulers.get(settings.scheduler.policy)))
    sinks = plugins.sinks().names()
    for i, sink in enumerate(settings.sinks):
        if sink.name not in sinks:
            errs.append(
                (
                    f"sinks[{at('sinks', i)}].name",
                    f"unknown sink {sink.name!r}; known: {', '.join(sinks)}{hint}",
                )
            )
    # the [[models]] list as in the file (entries set aside are None)
    models: list[ModelConfig | None] = [None] * (
        max((at("models", i) + 1 for i in range(len(settings.models))), default=0)
    )
    for i, kept in enumerate(settings.models):
        models[at("models", i)] = kept
    errs.extend(check_versions(models))
    errs.extend(check_gates(models))
    registry = plugins.backends()
    backends = registry.names()
    for i, model in enumerate(models):
        if model is None:
            continue
        if model.backend != "auto" and model.backend not in backends:
            errs.append(
                (
                    f"models[{i}].backend",
                    f"unknown backend {model.backend!r}; registered backends: "
                    f"{', '.join(backends)} or auto{hint}",
                )
            )
        elif model.backend != "auto" and (check := registry.get(model.backend).check_options):
            try:
                check(model)
            except ConfigError as exc:
                errs.extend(exc.errors or [(f"models[{i}].options", exc.message)])
    if errs:
        lines = "\n".join(f"  {k}: {m}" for k, m in errs)
        raise ConfigError(f"{len(errs)} config error(s):\n{lines}", errs)


def check_scheduler_tenants(settings: Settings, spec: SchedulerSpec) -> list[tuple[str, str]]:
    """``(key_path, message)`` for each ``[scheduler.tenants.<name>]`` setting the chosen
    policy does not read (a whole section when the policy reads none), and each
    policy-specific ``[scheduler]`` key (:data:`~servehall.admission.scheduler.POLICY_SETTINGS`)
    set for a policy that does not read it."""
    errs: list[tuple[str, str]] = []
    policy = spec.name
    own = sorted(spec.settings) or ["none"]
    for key in sorted((settings.scheduler.model_fields_set & POLICY_SETTINGS) - spec.settings):
        errs.append(
            (f"scheduler.{key}", f"not used by policy {policy!r} (it reads: {', '.join(own)})")
        )
    for tenant, section in settings.scheduler.tenants.items():
        path = f"scheduler.tenants.{tenant}"
        if not spec.tenant_settings:
            errs.append((path, f"policy {policy!r} has no tenant settings"))
            continue
        for key in sorted(section.model_fields_set - spec.tenant_settings):
            known = ", ".join(sorted(spec.tenant_settings))
            errs.append((f"{path}.{key}", f"not used by policy {policy!r} (it reads: {known})"))
    return errs
