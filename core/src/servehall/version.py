"""Versions of the distribution and of the hook contract."""

from __future__ import annotations

from servehall.errors import PluginError

__version__ = "0.1.0"

HOOK_API_VERSION = "2.0"
"""The hook contract's version (``major.minor``). A minor release only adds hooks or
optional arguments; a major release changes or removes something. A plugin states the
major version(s) it was written for in its entry module::

    SERVEHALL_HOOK_API = "2"        # or (2, 3): majors from 2 (inclusive) to 3 (exclusive)

and the host refuses, naming both versions, a plugin it cannot serve."""

HOOK_API_MAJOR = int(HOOK_API_VERSION.split(".")[0])


def check_hook_api(plugin: str, declared: object) -> str | None:
    """Check a plugin's ``SERVEHALL_HOOK_API`` declaration against :data:`HOOK_API_VERSION`.

    Args:
        plugin: the plugin's name (for the message).
        declared: the module attribute: None (not declared: accepted), a major version
            as ``int`` or ``str`` (``2``, ``"2"``, ``"2.0"``, ``"2.x"``), or a
            ``(min, max_exclusive)`` tuple of majors.

    Returns:
        The declaration as text for ``servehall plugins`` (None when not declared).

    Raises:
        PluginError: the declaration is malformed, or excludes this major version; the
            message names the plugin, the version it declares and the one provided.
    """
    if declared is None:
        return None
    try:
        if isinstance(declared, tuple | list) and len(declared) == 2:
            lo, hi = int(declared[0]), int(declared[1])
            text = f"{lo}.x" if hi == lo + 1 else f">={lo},<{hi}"
        elif isinstance(declared, int | str) and not isinstance(declared, bool):
            lo = int(str(declared).split(".")[0])
            hi = lo + 1
            text = f"{lo}.x"
        else:
            raise ValueError
    except (TypeError, ValueError):
        raise PluginError(
            f"plugin {plugin!r}: SERVEHALL_HOOK_API = {declared!r} is not a major version "
            f'such as "{HOOK_API_MAJOR}" or ({HOOK_API_MAJOR}, {HOOK_API_MAJOR + 1})'
        ) from None
    if not lo <= HOOK_API_MAJOR < hi:
        raise PluginError(
            f"plugin {plugin!r} is written for hook API {text}; this servehall provides hook "
            f"API {HOOK_API_VERSION} (upgrade the plugin, or use a servehall it supports)"
        )
    return text
