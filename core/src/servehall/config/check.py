"""``servehall config check``: every problem of a config file in one run.

:func:`~servehall.server.bootstrap.load_deployment` stops at the first stage that fails (core
types, then plugin names, then plugin sections, then policy/sink/backend names), which
is right for ``serve``. An operator fixing a file wants the whole list, so
:func:`check_config` goes on after each stage with what is valid: a core section (or a
``[[models]]``/``[[sinks]]`` entry) with a type error is set aside and the rest checked;
unknown plugin names are reported and the known ones loaded; then every plugin section
and every name the config refers to is checked.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import ValidationError
from pydantic_settings import SettingsError

from servehall.config.settings import (
    Settings,
    _env_error,
    _loc,
    read_config_file,
    validate_plugin_sections,
)
from servehall.errors import ConfigError, PluginError

_MAX_ROUNDS = 20


def _set_aside(data: dict[str, Any], loc: tuple[int | str, ...]) -> bool:
    """Set aside the part of ``data`` an error at ``loc`` lives in: a ``[[list]]`` entry,
    the key of a section (its default is used instead) or a whole section; False when
    nothing could be removed."""
    if not loc or not isinstance(loc[0], str) or loc[0] not in data:
        return False
    section = data[loc[0]]
    if isinstance(section, list) and len(loc) > 1 and isinstance(loc[1], int):
        if 0 <= loc[1] < len(section) and section[loc[1]] is not None:
            section[loc[1]] = None  # keep indexes of later entries stable
            return True
        return False
    if isinstance(section, dict) and len(loc) > 1 and loc[1] in section:
        data[loc[0]] = {k: v for k, v in section.items() if k != loc[1]}  # default instead
        return True
    del data[loc[0]]
    return True


def _core_settings(
    data: dict[str, Any], errs: list[tuple[str, str]]
) -> tuple[Settings, dict[str, list[int]]] | None:
    """Validate the core sections, collecting every error; what failed is set aside so the
    rest can be checked. Returns the settings and, per ``[[list]]`` section, the original
    index of each entry kept (``positions[section][i]`` for ``settings.<section>[i]``);
    None when even that cannot produce settings."""
    data = {k: (list(v) if isinstance(v, list) else v) for k, v in data.items()}
    seen: set[tuple[str, str]] = set()
    for _ in range(_MAX_ROUNDS):
        cleaned: dict[str, Any] = {
            k: [x for x in v if x is not None] if isinstance(v, list) else v
            for k, v in data.items()
        }
        try:
            positions = {
                k: [i for i, x in enumerate(v) if x is not None]
                for k, v in data.items()
                if isinstance(v, list)
            }
            return Settings(**cleaned), positions
        except SettingsError as exc:  # an environment override that is not JSON
            errs.append(_env_error(exc))
            return None
        except ValidationError as exc:
            removed = False
            raw = exc.errors()
            # indexes refer to the cleaned lists: map them back to the original positions
            # (all of them before any entry is set aside, which shifts the cleaned lists),
            # and name each error by its original position
            locs = [_original_loc(data, tuple(e["loc"])) for e in raw]
            for loc, e in zip(locs, raw, strict=True):
                err = (_loc(loc), e["msg"])
                if err not in seen:
                    seen.add(err)
                    errs.append(err)
                removed |= _set_aside(data, loc)
            if not removed:
                return None
    return None


def _original_loc(data: dict[str, Any], loc: tuple[int | str, ...]) -> tuple[int | str, ...]:
    """Map ``(section, i, ...)`` in the cleaned data (Nones dropped) to ``data``'s index."""
    if len(loc) > 1 and isinstance(loc[0], str) and isinstance(loc[1], int):
        section = data.get(loc[0])
        if isinstance(section, list):
            live = [i for i, x in enumerate(section) if x is not None]
            if loc[1] < len(live):
                return (loc[0], live[loc[1]], *loc[2:])
    return loc


def check_config(path: Path) -> list[tuple[str, str]]:
    """Every ``(key path, message)`` problem of the config file ``path`` (empty: valid).

    Environment overrides (``SERVEHALL_<SECTION>__<KEY>``) apply as in ``serve``. A file
    that cannot be read or parsed is one error (nothing else can be checked).
    """
    try:
        data = read_config_file(path.expanduser())
    except ConfigError as exc:
        return [("file", exc.message.removeprefix(f"{path}: "))]
    return check_config_data(data)


def check_config_data(data: dict[str, Any]) -> list[tuple[str, str]]:
    """Every ``(key path, message)`` problem of parsed config ``data`` (see
    :func:`check_config`; also used by live config changes, :mod:`servehall.rollout.live`)."""
    from servehall.plugin.manager import PluginHost, installed_entry_points
    from servehall.server.bootstrap import check_names

    errs: list[tuple[str, str]] = []
    core = _core_settings(data, errs)
    if core is None:
        return errs
    settings, positions = core
    installed = installed_entry_points()
    unknown = [n for n in settings.plugins.enabled if n not in installed]
    for name in unknown:
        names = ", ".join(sorted(installed)) or "none"
        errs.append(("plugins.enabled", f"unknown plugin {name!r}; installed plugins: {names}"))
    enabled = [n for n in settings.plugins.enabled if n not in unknown]
    try:
        plugins = PluginHost(enabled)
        plugins.check_enabled()
        models = plugins.settings_models()
    except PluginError as exc:
        errs.append(("plugins.enabled", exc.message))
        return errs
    if unknown:
        # sections of the unknown plugins cannot be validated: don't call them unknown too
        extra = settings.__pydantic_extra__ or {}
        for name in unknown:
            extra.pop(name, None)
    try:
        validate_plugin_sections(settings, models)
    except ConfigError as exc:
        errs.extend(exc.errors)
    try:
        check_names(settings, plugins, positions=positions)
    except ConfigError as exc:
        errs.extend(exc.errors)
    return errs
